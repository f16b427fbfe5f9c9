//! Unit tests of the inode table.

use super::*;

fn table() -> (Inodes, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("fencefs-inode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = std::fs::File::open(&dir).unwrap();
    (Inodes::new(root.into(), 16).unwrap(), dir)
}

/// A regular file's stat, with the inode number under test.
fn stat_of(dev: u64, ino: u64) -> libc::stat {
    let f = std::fs::File::open("/proc/self/exe").unwrap();
    let mut st = sys::fstat(f.as_fd()).unwrap();
    st.st_dev = dev;
    st.st_ino = ino;
    st
}

#[test]
fn a_reused_inode_number_after_a_removal_is_a_new_node() {
    let (t, dir) = table();
    let dev = t.root_dev();
    let a = t.insert(ROOT, b"a", &stat_of(dev, 5000), true, true);
    assert_eq!(a, 5000, "the host inode number is the node id");
    assert_eq!(
        t.insert(ROOT, b"a", &stat_of(dev, 5000), true, true),
        a,
        "the same file"
    );
    // Removed through the mount with no handle to keep it: the kernel still holds
    // the node (no FORGET yet) when the host hands the number to a new file.
    t.remove_alias(ROOT, b"a", b"a", None);
    let b = t.insert(ROOT, b"b", &stat_of(dev, 5000), true, true);
    assert_ne!(b, a, "a new file gets its own node");
    assert_eq!(t.paths(b).unwrap(), vec![b"b".to_vec()]);
    assert_eq!(
        t.paths(a).unwrap(),
        vec![b"a".to_vec()],
        "the old node keeps only the name it was removed under"
    );
    // The old node's FORGET leaves the new one alone.
    t.forget(a, 2);
    assert_eq!(t.insert(ROOT, b"b", &stat_of(dev, 5000), true, true), b);
    let _ = std::fs::remove_dir(dir);
}

#[test]
fn only_a_file_last_seen_below_the_upper_may_need_a_copy_up() {
    let (t, dir) = table();
    let dev = t.root_dev();
    let lower = t.insert(ROOT, b"lower", &stat_of(dev, 6000), true, false);
    let upper = t.insert(ROOT, b"upper", &stat_of(dev, 6001), true, true);
    assert!(t.may_copy_up(lower));
    assert!(!t.may_copy_up(upper));
    assert!(t.may_copy_up(987_654), "an unknown node may");
    // Seen again from the upper (copied up meanwhile): settled; the latest sight wins.
    assert_eq!(
        t.insert(ROOT, b"lower", &stat_of(dev, 6000), true, true),
        lower
    );
    assert!(!t.may_copy_up(lower));
    t.mark_settled(upper);
    assert!(!t.may_copy_up(upper));
    // A second name: two objects of the merged view may stand behind it.
    t.insert(ROOT, b"upper2", &stat_of(dev, 6001), true, true);
    assert!(t.may_copy_up(upper) && !t.settled_file(upper));
    // ... and stays unsettled with one name left (it may show another object).
    t.remove_alias(ROOT, b"upper", b"upper", None);
    assert!(t.may_copy_up(upper) && !t.settled_file(upper));
    // A directory's copy-up copies no data: never handed off for it.
    let mut dst = stat_of(dev, 6002);
    dst.st_mode = libc::S_IFDIR | 0o755;
    let d = t.insert(ROOT, b"d", &dst, true, false);
    assert!(!t.may_copy_up(d));
    let _ = std::fs::remove_dir(dir);
}
