//! The stage tools on trees deeper than the merged view lets an agent make (4,096 levels),
//! on a thread whose stack a recursive walk of them would overflow: read (status, ids,
//! repair), applied into SOURCE, removed; past [`MAX_DEPTH`] refused with ELOOP.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::changes::{Kind, Layers};
use super::tree::{Layer, MAX_DEPTH};
use crate::host::sys::{self, Name};

fn temp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("fencefs-deep-{name}-{}", std::process::id()));
    clean(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// `rm -rf` (its walk is not recursive either).
fn clean(p: &Path) {
    let _ = std::process::Command::new("rm").arg("-rf").arg(p).status();
}

/// `n` directories `d/d/…` below `root`, a file `f` in the last.
fn chain(root: &Path, n: usize) {
    let mut fd = sys::open_root(root).unwrap();
    let d = Name::new(b"d").unwrap();
    for _ in 0..n {
        sys::mkdirat(fd.as_fd(), &d, 0o755).unwrap();
        fd = sys::open_path(fd.as_fd(), &d).unwrap();
    }
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC;
    sys::openat(fd.as_fd(), &Name::new(b"f").unwrap(), flags, 0o644).unwrap();
}

/// Runs `f` on a thread with 256 KiB of stack.
fn small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

fn layers(upper: &Path, lower: &Path) -> Layers {
    let open = |p: &Path| Layer::new(sys::open_root(p).unwrap()).unwrap();
    Layers {
        upper: open(upper),
        lower: super::lower::Lower::plain(open(lower)),
    }
}

#[test]
fn a_tree_of_5000_levels_is_read_and_removed_without_recursion() {
    let top = temp("walk");
    let (up, low) = (top.join("upper"), top.join("lower"));
    std::fs::create_dir(&up).unwrap();
    std::fs::create_dir(&low).unwrap();
    chain(&up, 5000);
    let (u, lo) = (up.clone(), low.clone());
    small_stack(move || {
        let l = layers(&u, &lo);
        let c = l.changes().unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].kind.clone(), c[0].entries), (Kind::Added, Some(5000)));
        super::ids::id(&l, &c[0]).unwrap();
        assert!(l.repair().unwrap().is_empty());
        let mut diff = Vec::new();
        super::diff::write(&l, &c, &mut diff).unwrap();
        assert!(diff.starts_with(b"diff --git a/d/d/"));
        let d = Name::new(b"d").unwrap();
        super::remove::remove_tree(&l.upper, l.upper.root.as_fd(), &d).unwrap();
    });
    assert_eq!(std::fs::read_dir(&up).unwrap().count(), 0);
    clean(&top);
}

#[test]
fn a_tree_of_5000_levels_is_applied_into_source() {
    let top = temp("apply");
    let (dir, src) = (top.join("stage"), top.join("src"));
    std::fs::create_dir(&src).unwrap();
    let area = super::Area::create_or_open(&dir, &src, &top.join("mnt")).unwrap();
    chain(&area.dir.join("upper"), 5000);
    let d = area.dir.clone();
    drop(area);
    let report = small_stack(move || {
        super::session::apply_or_discard(&d, "apply", &[], Default::default(), 0).unwrap()
    });
    assert_eq!(report.refused, 0, "{:?}", report.lines);
    let mut fd = sys::open_root(&src).unwrap();
    for _ in 0..5000 {
        fd = sys::open_path(fd.as_fd(), &Name::new(b"d").unwrap()).unwrap();
    }
    sys::fstatat_nofollow(fd.as_fd(), &Name::new(b"f").unwrap()).unwrap();
    clean(&top);
}

#[test]
fn past_the_bound_a_walk_is_refused() {
    let top = temp("bound");
    let (up, low) = (top.join("upper"), top.join("lower"));
    std::fs::create_dir(&up).unwrap();
    std::fs::create_dir(&low).unwrap();
    chain(&up, MAX_DEPTH + 2);
    let (u, lo) = (up.clone(), low.clone());
    let e = small_stack(move || layers(&u, &lo).changes().unwrap_err().to_string());
    assert!(e.contains("deeper than 8192 directory levels"), "{e}");
    clean(&top);
}
