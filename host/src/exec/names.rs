//! Names of a prepared graph's tensors and nodes, held in one string per graph ([`Names`]),
//! and the name of a node in its run records ([`NodeName`]): a handle on that string, so an
//! execution allocates nothing per name, and the records of one execution share one
//! reference count.

use std::sync::{Arc, OnceLock};

use serde::Serialize;

use crate::error::{Error, Result};

/// Names by index (a prepared graph's tensors, by slot; its nodes), in one string: two
/// allocations for all of them, where a name each cost an allocation and a free per name,
/// and per execution a reference count per name. Their name order is made when first asked.
#[derive(Debug)]
pub(crate) struct Names {
    text: String,
    /// Slot i's name is `text[ends[i - 1]..ends[i]]` (from 0 for slot 0).
    ends: Vec<u32>,
    order: OnceLock<Vec<u32>>,
}

impl Names {
    /// `names`, by their order, in one pass over them (a second pass to size the text first
    /// cost more: each name is its own allocation in the graph, a cache miss to reach).
    pub fn new<'a>(names: impl Iterator<Item = &'a str>) -> Result<Self> {
        let mut text = String::new();
        let mut ends = Vec::with_capacity(names.size_hint().0);
        for n in names {
            text.push_str(n);
            let end = u32::try_from(text.len()).map_err(|_| {
                Error::invalid("workload", "the names take more than 2^32 - 1 bytes")
            })?;
            ends.push(end);
        }
        Ok(Self {
            text,
            ends,
            order: OnceLock::new(),
        })
    }

    /// Name `i`.
    pub fn name(&self, i: u32) -> &str {
        let i = i as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Indices in the order of their names; made at the first call.
    pub fn order(&self) -> &[u32] {
        self.order.get_or_init(|| {
            let mut v: Vec<u32> = (0..self.len() as u32).collect();
            v.sort_unstable_by(|&a, &b| self.name(a).cmp(self.name(b)));
            v
        })
    }
}

/// The name of a node, as its run record ([`super::NodeRun`]) holds it: a string of its own,
/// or a handle on the names of the prepared graph it ran in (no allocation per node). Reads as
/// a `&str` (`Deref`), displays and serializes as one.
#[derive(Clone)]
pub struct NodeName(Repr);

#[derive(Clone)]
enum Repr {
    Own(Arc<str>),
    Table(Arc<Names>, u32),
}

impl NodeName {
    /// Name `i` of `names`.
    pub(crate) fn of(names: &Arc<Names>, i: u32) -> Self {
        Self(Repr::Table(names.clone(), i))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Own(s) => s,
            Repr::Table(t, i) => t.name(*i),
        }
    }
}

impl std::ops::Deref for NodeName {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for NodeName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for NodeName {
    fn from(s: &str) -> Self {
        Self(Repr::Own(s.into()))
    }
}

impl From<String> for NodeName {
    fn from(s: String) -> Self {
        Self(Repr::Own(s.into()))
    }
}

impl PartialEq for NodeName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for NodeName {}

impl PartialEq<str> for NodeName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for NodeName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for NodeName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_back_by_index_and_in_name_order() -> Result<()> {
        let n = Names::new(["b", "", "ab", "a"].into_iter())?;
        assert_eq!(n.len(), 4);
        let got: Vec<&str> = (0..4).map(|i| n.name(i)).collect();
        assert_eq!(got, ["b", "", "ab", "a"]);
        assert_eq!(n.order(), [1, 3, 2, 0]);
        let t = Arc::new(n);
        let name = NodeName::of(&t, 2);
        assert_eq!(&*name, "ab");
        assert_eq!(name, NodeName::from("ab"));
        assert_eq!(name.to_string(), "ab");
        assert_eq!(serde_json::to_string(&name).ok().as_deref(), Some("\"ab\""));
        Ok(())
    }
}
