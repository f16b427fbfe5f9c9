//! Workspace paths as bytes: relative, `/`-separated, no leading or trailing slash (the
//! empty path is the root). Shared by the inode table and the merged view.
//!
//! Invariants: pure functions, no syscall; a path is never normalised here (the callers
//! hand in names already checked to be single components).

/// `parent/name` (`name` alone at the root, where `parent` is empty).
pub fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
    p.extend_from_slice(parent);
    if !parent.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

#[cfg(test)]
mod tests {
    use super::join;

    #[test]
    fn joins_below_the_root_and_at_it() {
        assert_eq!(join(b"", b"a"), b"a");
        assert_eq!(join(b"a/b", b"c"), b"a/b/c");
    }
}
