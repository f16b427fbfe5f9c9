//! Kernel overlayfs as the oracle of a staged mount's merged view (tests/stage_fresh.rs,
//! tests/stage_union_redteam.rs): the same DIR mounted read-only by overlayfs over SOURCE,
//! the views compared entry by entry, and the small generator the random runs draw from.
//!
//! A DIR made by a daemon as root has `trusted.overlay.*` markers (mounted with
//! `redirect_dir=follow`); one made by an ordinary user's daemon has `user.overlay.*`
//! markers, read by overlayfs only with `userxattr` — which implies `redirect_dir=nofollow`
//! (the kernel refuses `userxattr` with `redirect_dir=on|follow`, and a lookup that meets a
//! redirect fails EPERM, "refusing to follow redirect"): such a DIR's renamed directories
//! with lower parts are beyond this oracle.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Mount, sh_in, snapshot};

/// The same DIR (upper and live layers) over SOURCE, mounted read-only by kernel
/// overlayfs at `at`; unmounted when dropped.
pub struct Oracle {
    pub at: PathBuf,
}

/// Which markers DIR holds, so how the oracle reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Markers {
    /// `trusted.overlay.*`: a daemon as root.
    Trusted,
    /// `user.overlay.*`: an ordinary user's daemon (`-o userxattr`, no redirects).
    User,
}

impl Oracle {
    pub fn mount(dir: &Path, src: &Path, at: &Path) -> Oracle {
        Oracle::mount_with(dir, src, at, Markers::Trusted)
    }

    /// [`Oracle::mount`] reading `markers`.
    pub fn mount_with(dir: &Path, src: &Path, at: &Path, markers: Markers) -> Oracle {
        Oracle::stack(dir, src, at, markers, None)
    }

    /// The view at checkpoint `n` of a root's DIR: its sealed layers `n … 1` over
    /// SOURCE, without the upper or later layers (what `--since N` compares against).
    pub fn at_checkpoint(dir: &Path, src: &Path, at: &Path, n: u64) -> Oracle {
        Oracle::stack(dir, src, at, Markers::Trusted, Some(n))
    }

    /// The upper and every layer (`upto` `None`), or layers `upto … 1`, over SOURCE.
    fn stack(dir: &Path, src: &Path, at: &Path, markers: Markers, upto: Option<u64>) -> Oracle {
        fs::create_dir_all(at).unwrap();
        let mut lowers = match upto {
            None => vec![dir.join("upper")],
            Some(_) => Vec::new(),
        };
        let mut layers: Vec<u64> = fs::read_dir(dir.join("layers"))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        layers.retain(|&l| upto.is_none_or(|n| l <= n));
        layers.sort_unstable_by(|a, b| b.cmp(a));
        lowers.extend(
            layers
                .iter()
                .map(|n| dir.join("layers").join(n.to_string())),
        );
        lowers.push(src.to_path_buf());
        let lower: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
        let opts = match markers {
            Markers::Trusted => "redirect_dir=follow,index=off,metacopy=off",
            Markers::User => "userxattr,redirect_dir=nofollow,index=off,metacopy=off",
        };
        sh_in(
            Path::new("/"),
            &format!(
                "mount -t overlay overlay -o ro,lowerdir={},{opts} {}",
                lower.join(":"),
                at.display()
            ),
        )
        .assert_ok("kernel overlayfs oracle");
        Oracle {
            at: at.to_path_buf(),
        }
    }

    /// What the oracle shows for `m`'s DIR now (mounted beside SOURCE, then unmounted).
    pub fn view_of(m: &Mount, dir: &Path) -> View {
        Oracle::view_with(m, dir, Markers::Trusted)
    }

    /// [`Oracle::view_of`] reading `markers`.
    pub fn view_with(m: &Mount, dir: &Path, markers: Markers) -> View {
        let at = m.host("").parent().unwrap().join("oracle");
        let o = Oracle::mount_with(dir, &m.host(""), &at, markers);
        view(&o.at)
    }
}

impl Drop for Oracle {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.at).status();
    }
}

/// A tree as the views are compared.
pub type View = Vec<(Vec<u8>, String)>;

/// Entries as both views are compared: type, mode, owner, size and contents, symlink
/// targets (times and xattrs differ by design: the oracle's own).
pub fn view(root: &Path) -> View {
    snapshot(root)
        .into_iter()
        .map(|(p, e)| {
            (
                p,
                format!("{} {:o} {}:{} {:?}", e.kind, e.mode, e.uid, e.gid, e.data),
            )
        })
        .collect()
}

/// What only `got` and only `want` hold, for a failure message.
pub fn view_diff(got: &View, want: &View) -> String {
    let only = |a: &View, b: &View| -> Vec<String> {
        a.iter()
            .filter(|x| !b.contains(x))
            .map(|(p, e)| format!("{} {e}", String::from_utf8_lossy(p)))
            .collect()
    };
    format!(
        "mount only: {:#?}\noracle only: {:#?}",
        only(got, want),
        only(want, got)
    )
}

/// The mount shows what kernel overlayfs shows over the same DIR.
pub fn matches_oracle(m: &Mount, dir: &Path) -> Result<(), String> {
    let want = Oracle::view_of(m, dir);
    let got = view(&m.mnt(""));
    if got == want {
        Ok(())
    } else {
        Err(view_diff(&got, &want))
    }
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[(self.next() % v.len() as u64) as usize]
    }
}
