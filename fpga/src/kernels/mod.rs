//! The kernel cores (datapaths that plug into [`crate::shell`]) and the kernel catalog.
//!
//! To add a kernel: implement [`crate::core::KernelCore`] in its own module here, add the
//! `pub mod` line and an arm to [`core_for`].

pub mod attention;
pub mod gemm;
pub mod router;
pub mod vecops;

use crate::core::{CoreError, KernelCore};

/// Kernel names the catalog knows.
pub const KERNELS: &[&str] = &["router", "gemm", "attention", "vecops"];

/// Parses `k=v,k=v` build parameters (integers).
pub fn parse_params(s: &str) -> Result<Vec<(String, i64)>, CoreError> {
    let mut v = Vec::new();
    for kv in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let (k, val) = kv.split_once('=').ok_or_else(|| CoreError::Param {
            kernel: "?".into(),
            msg: format!("`{kv}` is not key=value"),
        })?;
        let val: i64 = val.trim().parse().map_err(|_| CoreError::Param {
            kernel: "?".into(),
            msg: format!("`{kv}`: value is not an integer"),
        })?;
        v.push((k.trim().to_string(), val));
    }
    Ok(v)
}

fn take(
    kernel: &str,
    params: &[(String, i64)],
    known: &[&str],
) -> Result<std::collections::BTreeMap<String, i64>, CoreError> {
    let mut m = std::collections::BTreeMap::new();
    for (k, v) in params {
        if !known.contains(&k.as_str()) {
            return Err(CoreError::Param {
                kernel: kernel.into(),
                msg: format!("unknown parameter `{k}` (known: {})", known.join(", ")),
            });
        }
        m.insert(k.clone(), *v);
    }
    Ok(m)
}

fn get_u32(
    kernel: &str,
    m: &std::collections::BTreeMap<String, i64>,
    k: &str,
    default: u32,
) -> Result<u32, CoreError> {
    match m.get(k) {
        None => Ok(default),
        Some(&v) => u32::try_from(v).map_err(|_| CoreError::Param {
            kernel: kernel.into(),
            msg: format!("{k} = {v} is out of range"),
        }),
    }
}

/// A kernel build with its parameters, typed: what the host backend, the cycle models
/// ([`crate::timing`]) and the modelled card need to know about a core beyond its Verilog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// The MoE router.
    Router(router::RouterCore),
    /// The GEMM.
    Gemm(gemm::GemmCore),
    /// Streaming attention.
    Attention(attention::AttentionCore),
    /// The streaming vector ops (add, RMSNorm, RoPE, SiLU x up).
    Vecops(vecops::VecopsCore),
}

impl Build {
    /// The build of kernel `name` with `params` (unknown keys are an error; missing ones take
    /// the defaults).
    pub fn parse(name: &str, params: &[(String, i64)]) -> Result<Self, CoreError> {
        let b = match name {
            "router" => {
                let m = take(name, params, &["e_max", "k_max", "lanes", "data_bits"])?;
                let d = router::RouterCore::default();
                let lanes = get_u32(name, &m, "lanes", d.lanes)?;
                // without data_bits: the default build's port, or the narrowest that holds
                // the lanes asked for
                let bits = if m.contains_key("lanes") {
                    router::RouterCore::data_bits_for(lanes)
                } else {
                    d.data_bits
                };
                Build::Router(router::RouterCore {
                    e_max: get_u32(name, &m, "e_max", d.e_max)?,
                    k_max: get_u32(name, &m, "k_max", d.k_max)?,
                    lanes,
                    data_bits: get_u32(name, &m, "data_bits", bits)?,
                })
            }
            "gemm" => {
                let m = take(
                    name,
                    params,
                    &["rows", "k_max", "n_max", "lanes", "w_ports"],
                )?;
                let d = gemm::GemmCore::default();
                Build::Gemm(gemm::GemmCore {
                    rows: get_u32(name, &m, "rows", d.rows)?,
                    k_max: get_u32(name, &m, "k_max", d.k_max)?,
                    n_max: get_u32(name, &m, "n_max", d.n_max)?,
                    lanes: get_u32(name, &m, "lanes", d.lanes)?,
                    w_ports: match get_u32(name, &m, "w_ports", u32::from(d.w_ports))? {
                        0 => false,
                        1 => true,
                        v => {
                            return Err(CoreError::Param {
                                kernel: name.into(),
                                msg: format!("w_ports = {v} must be 0 or 1"),
                            });
                        }
                    },
                })
            }
            "attention" => {
                let m = take(name, params, &["d_max", "nkv_max", "kv_tile", "q_rows"])?;
                let d = attention::AttentionCore::default();
                Build::Attention(attention::AttentionCore {
                    d_max: get_u32(name, &m, "d_max", d.d_max)?,
                    nkv_max: get_u32(name, &m, "nkv_max", d.nkv_max)?,
                    kv_tile: get_u32(name, &m, "kv_tile", d.kv_tile)?,
                    q_rows: get_u32(name, &m, "q_rows", d.q_rows)?,
                })
            }
            "vecops" => {
                let m = take(name, params, &["n_max"])?;
                let d = vecops::VecopsCore::default();
                Build::Vecops(vecops::VecopsCore {
                    n_max: get_u32(name, &m, "n_max", d.n_max)?,
                })
            }
            _ => {
                return Err(CoreError::Param {
                    kernel: name.into(),
                    msg: format!("unknown kernel (known: {})", KERNELS.join(", ")),
                });
            }
        };
        match &b {
            Build::Router(c) => c.validate()?,
            Build::Gemm(c) => c.validate()?,
            Build::Attention(c) => c.validate()?,
            Build::Vecops(c) => c.validate()?,
        }
        Ok(b)
    }

    /// The build of a core (by its name and parameters).
    pub fn of(core: &dyn KernelCore) -> Result<Self, CoreError> {
        Self::parse(core.name(), &core.params())
    }

    /// The core as a trait object.
    pub fn core(&self) -> &dyn KernelCore {
        match self {
            Build::Router(c) => c,
            Build::Gemm(c) => c,
            Build::Attention(c) => c,
            Build::Vecops(c) => c,
        }
    }
}

/// The core of kernel `name` built with `params` (unknown keys are an error).
pub fn core_for(name: &str, params: &[(String, i64)]) -> Result<Box<dyn KernelCore>, CoreError> {
    Ok(match Build::parse(name, params)? {
        Build::Router(c) => Box::new(c),
        Build::Gemm(c) => Box::new(c),
        Build::Attention(c) => Box::new(c),
        Build::Vecops(c) => Box::new(c),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse_and_unknown_keys_fail() {
        let p = parse_params("e_max=64, k_max=4").expect("parse");
        assert_eq!(p, vec![("e_max".into(), 64), ("k_max".into(), 4)]);
        assert!(core_for("router", &p).is_ok());
        assert!(core_for("router", &parse_params("lanes=2").expect("parse")).is_ok());
        assert!(core_for("router", &parse_params("lanes=3").expect("parse")).is_err());
        // lanes alone: the narrowest port that holds them; a port too narrow is refused
        let r = |p: &str| Build::parse("router", &parse_params(p).expect("parse"));
        assert!(matches!(
            r("lanes=4"),
            Ok(Build::Router(c)) if c.data_bits == 64
        ));
        assert!(matches!(
            r("e_max=64"),
            Ok(Build::Router(c)) if (c.lanes, c.data_bits) == (8, 128)
        ));
        assert!(matches!(
            r("lanes=4,data_bits=128"),
            Ok(Build::Router(c)) if c.data_bits == 128
        ));
        assert!(r("lanes=8,data_bits=64").is_err());
        assert!(core_for("router", &parse_params("width=2").expect("parse")).is_err());
        assert!(parse_params("e_max").is_err());
        assert!(core_for("nope", &[]).is_err());
    }
}
