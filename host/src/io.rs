//! Reading and writing tensors in safetensors files.
//!
//! Files may hold f64, f32, f16, bf16, i64, i32, i8 (and a few more) tensors; on reading, f64
//! becomes f32 and i64 becomes i32 (checked for range), the logical dtypes tandem computes in.
//! [`read_safetensors_f64`] keeps full precision for reference comparisons.

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{HostData, Tensor};

/// A weight file's bytes: mapped (the pages are read as tensors are converted, and a shard of
/// many GB never sits in memory twice), or read whole where mapping is refused (an empty file,
/// a file system without mmap).
enum FileBytes {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Read(v) => v,
        }
    }
}

fn read_file(path: &Path) -> Result<FileBytes> {
    let f =
        std::fs::File::open(path).map_err(|e| Error::file(path, format!("cannot read: {e}")))?;
    // SAFETY: the map is read while the tensors are converted, then dropped; a weight file
    // changed by another process meanwhile would give wrong values, as a concurrent write
    // would to a plain read (the usual contract of safetensors' own loaders).
    match unsafe { memmap2::Mmap::map(&f) } {
        Ok(m) => Ok(FileBytes::Mapped(m)),
        Err(_) => std::fs::read(path)
            .map(FileBytes::Read)
            .map_err(|e| Error::file(path, format!("cannot read: {e}"))),
    }
}

fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes)
        .map_err(|e| Error::file(path, format!("not a valid safetensors file: {e}")))
}

fn values<T: bytemuck::Pod>(data: &[u8]) -> Vec<T> {
    bytemuck::pod_collect_to_vec(data)
}

fn array<T>(path: &Path, name: &str, shape: &[usize], v: Vec<T>) -> Result<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), v)
        .map_err(|e| Error::file(path, format!("tensor '{name}': {e}")))
}

/// One tensor of a parsed file as a logical tensor (f64 -> f32, i64 -> i32 checked).
fn tensor_of(
    path: &Path,
    name: &str,
    view: &safetensors::tensor::TensorView<'_>,
) -> Result<Tensor> {
    let shape = view.shape().to_vec();
    let d = view.data();
    let data = match view.dtype() {
        StDtype::F64 => HostData::F32(array(
            path,
            name,
            &shape,
            values::<f64>(d).into_iter().map(|x| x as f32).collect(),
        )?),
        StDtype::F32 => HostData::F32(array(path, name, &shape, values::<f32>(d))?),
        StDtype::F16 => HostData::F16(array(path, name, &shape, values::<f16>(d))?),
        StDtype::BF16 => HostData::BF16(array(path, name, &shape, values::<bf16>(d))?),
        StDtype::I8 => HostData::I8(array(path, name, &shape, values::<i8>(d))?),
        StDtype::I32 => HostData::I32(array(path, name, &shape, values::<i32>(d))?),
        StDtype::I64 => {
            let v = values::<i64>(d)
                .into_iter()
                .map(|x| {
                    i32::try_from(x).map_err(|_| {
                        Error::file(
                            path,
                            format!("tensor '{name}': value {x} does not fit in i32"),
                        )
                    })
                })
                .collect::<Result<Vec<i32>>>()?;
            HostData::I32(array(path, name, &shape, v)?)
        }
        other => {
            return Err(Error::file(
                path,
                format!(
                    "tensor '{name}' has dtype {other:?} (accepted: F64, F32, F16, BF16, I64, I32, I8)"
                ),
            ));
        }
    };
    Ok(Tensor::new(data))
}

/// Reads every tensor of a safetensors file as a logical tensor (f32 / i32 / i8 / f16 / bf16).
pub fn read_safetensors(path: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    let st = parse(path, &bytes)?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let t = tensor_of(path, &name, &view)?;
        out.insert(name, t);
    }
    Ok(out)
}

/// Reads the tensors named in `names` from a safetensors file (as [`read_safetensors`] does),
/// converting no other; a name the file lacks is an error naming the file and the tensor.
pub fn read_safetensors_named(
    path: impl AsRef<Path>,
    names: &[&str],
) -> Result<BTreeMap<String, Tensor>> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    let st = parse(path, &bytes)?;
    let mut out = BTreeMap::new();
    for &name in names {
        let view = st.tensor(name).map_err(|_| {
            Error::file(
                path,
                format!("no tensor '{name}' (the file holds {} tensors)", st.len()),
            )
        })?;
        out.insert(name.to_string(), tensor_of(path, name, &view)?);
    }
    Ok(out)
}

/// The names of the tensors of a safetensors file, from its header alone (the data is not
/// read: a large file costs its header's size).
pub fn safetensors_names(path: impl AsRef<Path>) -> Result<Vec<String>> {
    use std::io::Read;
    let path = path.as_ref();
    let bad = |msg: String| Error::file(path, format!("not a valid safetensors file: {msg}"));
    let mut f =
        std::fs::File::open(path).map_err(|e| Error::file(path, format!("cannot read: {e}")))?;
    let file_len = f
        .metadata()
        .map_err(|e| Error::file(path, format!("cannot read: {e}")))?
        .len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| bad(format!("no header length ({e})")))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER || n.saturating_add(8) > file_len {
        return Err(bad(format!(
            "header of {n} bytes in a file of {file_len} bytes"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| bad(format!("header cut short ({e})")))?;
    let v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    Ok(v.into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != "__metadata__")
        .collect())
}

/// The largest safetensors header read (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// Reads every floating-point or integer tensor of a safetensors file as f64.
pub fn read_safetensors_f64(path: impl AsRef<Path>) -> Result<BTreeMap<String, ArrayD<f64>>> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    let st = parse(path, &bytes)?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        let d = view.data();
        let v: Vec<f64> = match view.dtype() {
            StDtype::F64 => values::<f64>(d),
            StDtype::I64 => values::<i64>(d).into_iter().map(|x| x as f64).collect(),
            _ => {
                let t = read_one(path, &st, &name)?;
                out.insert(name, t.to_f64());
                continue;
            }
        };
        out.insert(name.clone(), array(path, &name, &shape, v)?);
    }
    Ok(out)
}

fn read_one(path: &Path, st: &SafeTensors<'_>, name: &str) -> Result<Tensor> {
    let view = st
        .tensor(name)
        .map_err(|e| Error::file(path, format!("tensor '{name}': {e}")))?;
    let shape = view.shape().to_vec();
    let d = view.data();
    Ok(Tensor::new(match view.dtype() {
        StDtype::F32 => HostData::F32(array(path, name, &shape, values::<f32>(d))?),
        StDtype::F16 => HostData::F16(array(path, name, &shape, values::<f16>(d))?),
        StDtype::BF16 => HostData::BF16(array(path, name, &shape, values::<bf16>(d))?),
        StDtype::I8 => HostData::I8(array(path, name, &shape, values::<i8>(d))?),
        StDtype::I32 => HostData::I32(array(path, name, &shape, values::<i32>(d))?),
        other => {
            return Err(Error::file(
                path,
                format!("tensor '{name}' has unsupported dtype {other:?}"),
            ));
        }
    }))
}

fn st_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I8 => StDtype::I8,
        DType::I32 => StDtype::I32,
    }
}

/// Writes tensors to a safetensors file through [`crate::files::write_atomic`] (a temporary
/// file of a unique name, then renamed: a failure or a concurrent writer never leaves a
/// half-written or mixed file at `path`).
pub fn write_safetensors(path: impl AsRef<Path>, tensors: &BTreeMap<String, Tensor>) -> Result<()> {
    write_safetensors_with(path, tensors, None)
}

/// [`write_safetensors`] with the header's `__metadata__` (transformers writes
/// `{"format": "pt"}` and checks it on loading).
pub fn write_safetensors_with(
    path: impl AsRef<Path>,
    tensors: &BTreeMap<String, Tensor>,
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let owned: Vec<(String, Vec<u8>, Vec<usize>, StDtype)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.to_bytes(),
                t.shape().to_vec(),
                st_dtype(t.dtype()),
            )
        })
        .collect();
    let views = owned
        .iter()
        .map(|(n, b, s, d)| {
            safetensors::tensor::TensorView::new(*d, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::Internal(format!("safetensors view '{n}': {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(
        views,
        &metadata.map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
    )
    .map_err(|e| Error::file(path, format!("cannot serialise: {e}")))?;
    crate::files::write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_the_header_and_tensors_by_name()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join("t.safetensors");
        let a = Tensor::from_vec_f32(&[2, 3], vec![1.0, -2.5, 3.0, 0.0, 7.0, -1.0])?;
        let t = BTreeMap::from([
            ("a".to_string(), a.cast(DType::BF16)),
            ("b".to_string(), a.cast(DType::F16)),
            ("c".to_string(), Tensor::from_vec_i32(&[2], vec![4, 5])?),
        ]);
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        write_safetensors_with(&p, &t, Some(&meta))?;
        let mut names = safetensors_names(&p)?;
        names.sort();
        assert_eq!(names, ["a", "b", "c"]);
        let got = read_safetensors_named(&p, &["b", "a"])?;
        assert_eq!(got.len(), 2);
        // bf16 and f16 read back as stored; these values are exact in both.
        assert_eq!(got["a"].dtype(), DType::BF16);
        assert_eq!(got["b"].dtype(), DType::F16);
        assert_eq!(got["a"].to_f32(), a.to_f32());
        assert_eq!(got["b"].to_f32(), a.to_f32());
        let m = read_safetensors_named(&p, &["a", "zz"])
            .expect_err("no zz")
            .to_string();
        assert!(
            m.contains("t.safetensors") && m.contains("no tensor 'zz'"),
            "{m}"
        );
        // A cut file: its header names the file.
        let bytes = std::fs::read(&p)?;
        let cut = dir.path().join("cut.safetensors");
        std::fs::write(&cut, &bytes[..12])?;
        let m = safetensors_names(&cut).expect_err("cut").to_string();
        assert!(
            m.contains("cut.safetensors") && m.contains("not a valid safetensors"),
            "{m}"
        );
        std::fs::write(&cut, &bytes[..4])?;
        assert!(safetensors_names(&cut).is_err());
        Ok(())
    }
}
