//! A `fencefs.dev` inline volume's `volumeAttributes`, read and checked before anything
//! is mounted, and where the pod's sidecar socket is (derived from the target path the
//! kubelet gives: `…/pods/UID/volumes/kubernetes.io~csi/NAME/mount` → `…/pods/UID/volumes/
//! kubernetes.io~empty-dir/SOCKETVOLUME/SOCKET`).
//!
//! Invariants: every error names the attribute and what was wrong with it (it reaches the
//! pod's events as the gRPC status's message); an unknown attribute is an error (a typo is
//! not silently ignored), except the kubelet's own `csi.storage.k8s.io/*`; uid and gid 0
//! are refused (the sidecar and the agent run unprivileged); names are one path component.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The checked attributes of one volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attrs {
    /// Who may use the mount (the kernel's `user_id`/`group_id`): the pod's runAsUser and
    /// runAsGroup, the agent's and the sidecar's.
    pub uid: u32,
    pub gid: u32,
    /// The emptyDir volume shared with the sidecar, and the socket's name in it.
    pub socket_volume: String,
    pub socket: String,
    /// How long the sidecar has to take the descriptor.
    pub timeout: Duration,
    /// Let other uids in (the kernel then checks Unix permissions).
    pub allow_other: bool,
}

/// The attributes a volume may have.
const KNOWN: &[&str] = &[
    "uid",
    "gid",
    "socketVolume",
    "socket",
    "handoverTimeout",
    "allowOther",
];

/// Reads and checks `volumeAttributes` (the request's volume_context).
pub fn parse(ctx: &HashMap<String, String>) -> Result<Attrs, String> {
    if let Some(k) = ctx
        .keys()
        .find(|k| !k.starts_with("csi.storage.k8s.io/") && !KNOWN.contains(&k.as_str()))
    {
        return Err(format!(
            "volume attribute '{k}' is unknown (known: {})",
            KNOWN.join(", ")
        ));
    }
    let id = |k: &str| -> Result<u32, String> {
        let v = ctx.get(k).ok_or_else(|| {
            format!("volume attribute '{k}' is missing: the pod's numeric {k} (runAsUser/runAsGroup) that may use the mount")
        })?;
        match v.parse::<u32>() {
            Ok(0) => Err(format!(
                "volume attribute '{k}' is 0: the agent and the sidecar must not run as root"
            )),
            Ok(n) => Ok(n),
            Err(_) => Err(format!("volume attribute '{k}' is '{v}': not a number")),
        }
    };
    let socket_volume = ctx.get("socketVolume").ok_or(
        "volume attribute 'socketVolume' is missing: the emptyDir volume the sidecar's --fuse-fd-from socket is in",
    )?;
    let socket = ctx
        .get("socket")
        .map_or("fencefs.sock", String::as_str)
        .to_string();
    for (k, v) in [("socketVolume", socket_volume), ("socket", &socket)] {
        if !one_component(v) {
            return Err(format!(
                "volume attribute '{k}' is '{v}': must be a single name (no '/', not '.' or '..')"
            ));
        }
    }
    let timeout = match ctx.get("handoverTimeout") {
        None => 120,
        Some(v) => match v.parse::<u64>() {
            Ok(n @ 1..=3600) => n,
            _ => {
                return Err(format!(
                    "volume attribute 'handoverTimeout' is '{v}': seconds between 1 and 3600"
                ));
            }
        },
    };
    let allow_other = match ctx.get("allowOther").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return Err(format!(
                "volume attribute 'allowOther' is '{v}': true or false"
            ));
        }
    };
    Ok(Attrs {
        uid: id("uid")?,
        gid: id("gid")?,
        socket_volume: socket_volume.clone(),
        socket,
        timeout: Duration::from_secs(timeout),
        allow_other,
    })
}

fn one_component(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// The directory of the sidecar's emptyDir on the node, from the kubelet's target path.
pub fn socket_dir(target: &Path, a: &Attrs) -> Result<PathBuf, String> {
    let bad = || {
        format!(
            "target path '{}' is not a kubelet CSI volume path (…/volumes/kubernetes.io~csi/NAME/mount)",
            target.display()
        )
    };
    let csi = target.parent().and_then(Path::parent).ok_or_else(bad)?;
    if csi.file_name().is_none_or(|n| n != "kubernetes.io~csi") {
        return Err(bad());
    }
    let volumes = csi.parent().ok_or_else(bad)?;
    Ok(volumes
        .join("kubernetes.io~empty-dir")
        .join(&a.socket_volume))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn attributes_are_checked_and_named() {
        let ok = ctx(&[
            ("uid", "1000"),
            ("gid", "1000"),
            ("socketVolume", "fencefs"),
            ("csi.storage.k8s.io/pod.name", "agent"),
        ]);
        let a = parse(&ok).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((a.uid, a.socket.as_str()), (1000, "fencefs.sock"));
        let err = |extra: &[(&str, &str)], drop: &str| {
            let mut c = ok.clone();
            c.remove(drop);
            c.extend(ctx(extra));
            parse(&c).err().unwrap_or_default()
        };
        assert!(err(&[], "uid").contains("'uid' is missing"));
        assert!(err(&[("uid", "0")], "").contains("must not run as root"));
        assert!(err(&[("gid", "x")], "").contains("'gid' is 'x'"));
        assert!(err(&[("socket", "../x")], "").contains("single name"));
        assert!(err(&[("polcy", "x")], "").contains("'polcy' is unknown"));
        assert!(err(&[("handoverTimeout", "0")], "").contains("handoverTimeout"));
        let t = Path::new("/var/lib/kubelet/pods/P/volumes/kubernetes.io~csi/ws/mount");
        assert_eq!(
            socket_dir(t, &a).ok(),
            Some(PathBuf::from(
                "/var/lib/kubelet/pods/P/volumes/kubernetes.io~empty-dir/fencefs"
            ))
        );
        assert!(socket_dir(Path::new("/tmp/x/mount"), &a).is_err());
    }
}
