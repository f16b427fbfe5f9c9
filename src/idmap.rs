//! uid/gid mapping between the callers' ids (e.g. a container's) and the host's.
//!
//! `--map-uid C:H` makes a file owned by host uid H appear owned by C through the mount,
//! and files created or chowned by caller uid C land on the host owned by H. Unmapped ids
//! pass through unchanged. The policy's `uid`/`gid` rules match the caller's own ids.

/// One direction-agnostic id map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap {
    pairs: Vec<(u32, u32)>,
}

impl IdMap {
    /// Parses `C:H` entries.
    pub fn parse(entries: &[String]) -> Result<IdMap, String> {
        let mut pairs = Vec::new();
        for e in entries {
            let (c, h) = e
                .split_once(':')
                .ok_or_else(|| format!("id map '{e}': expected CONTAINER:HOST"))?;
            let c: u32 = c
                .parse()
                .map_err(|_| format!("id map '{e}': bad container id"))?;
            let h: u32 = h
                .parse()
                .map_err(|_| format!("id map '{e}': bad host id"))?;
            if pairs.iter().any(|&(pc, ph)| pc == c || ph == h) {
                return Err(format!("id map '{e}': id mapped twice"));
            }
            pairs.push((c, h));
        }
        Ok(IdMap { pairs })
    }

    /// Caller id → host id.
    pub fn to_host(&self, id: u32) -> u32 {
        self.pairs.iter().find(|p| p.0 == id).map_or(id, |p| p.1)
    }

    /// Host id → caller id.
    pub fn to_caller(&self, id: u32) -> u32 {
        self.pairs.iter().find(|p| p.1 == id).map_or(id, |p| p.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_both_ways_and_passes_the_rest() {
        let m = IdMap::parse(&["1000:501".into(), "0:0".into()]).unwrap();
        assert_eq!(m.to_host(1000), 501);
        assert_eq!(m.to_caller(501), 1000);
        assert_eq!(m.to_host(7), 7);
        assert_eq!(m.to_caller(7), 7);
    }

    #[test]
    fn rejects_bad_entries() {
        assert!(IdMap::parse(&["1000".into()]).is_err());
        assert!(IdMap::parse(&["a:1".into()]).is_err());
        assert!(IdMap::parse(&["1:2".into(), "1:3".into()]).is_err());
    }
}
