//! `stage apply` writes what was staged, not more, on real mounts: a 64 MiB sparse file
//! holding two bytes lands in SOURCE sparse (its data extents copied, its holes left
//! holes) with the same bytes; eight names of one 4 MiB file (one of them inside a new
//! directory) land as eight hard links of one SOURCE file; `status --json` and `diff`
//! show the sparse file's size and allocation; an apply of one name of a linked file
//! leaves the others staged and correct; what a crash between the renames of a linked
//! file's names leaves is recovered without losing any of them; and a live apply over a
//! checkpoint lands the names the staged tree holds as one file as one SOURCE file.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::stage::*;
use common::*;

const MIB: usize = 1 << 20;

/// The sparse file staged: 64 MiB, `x` at 10 MiB and `y` at 60 MiB, holes elsewhere.
const MAKE_SPARSE: &str = "truncate -s 64M sparse; \
    printf x | dd of=sparse bs=1 seek=10M conv=notrunc status=none; \
    printf y | dd of=sparse bs=1 seek=60M conv=notrunc status=none";

fn sparse_bytes() -> Vec<u8> {
    let mut v = vec![0u8; 64 * MIB];
    v[10 * MIB] = b'x';
    v[60 * MIB] = b'y';
    v
}

/// (inode, link count) of `p`.
fn id(p: &Path) -> (u64, u64) {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.ino(), m.nlink())
}

fn allocated(p: &Path) -> u64 {
    fs::metadata(p).unwrap().blocks() * 512
}

/// Whether `a` holds exactly `want` (without printing 64 MiB on a mismatch).
fn holds(a: &Path, want: &[u8]) -> bool {
    fs::read(a).unwrap_or_else(|e| panic!("{}: {e}", a.display())) == want
}

/// Every apply temporary entry under `dir`.
fn temporaries(dir: &Path) -> Vec<String> {
    let out = sh_in(
        dir,
        "find . -name '*.fencefs-apply-*' -o -name '*.fencefs-delete-*'",
    );
    out.assert_ok("find temporaries");
    out.stdout.lines().map(str::to_string).collect()
}

#[test]
fn a_sparse_file_lands_sparse_and_hard_links_land_as_one_file() {
    let (mut m, dir) = staged("stage-space", WRITE, staged_sample);
    m.sh(&format!(
        "set -e; {MAKE_SPARSE}; head -c 4M /dev/urandom > big; \
         for i in 2 3 4 5 6 7; do ln big link$i; done; mkdir new; ln big new/inner"
    ))
    .assert_ok("stage a sparse file and eight names of one file");
    let big = fs::read(m.mnt("big")).unwrap();
    assert_eq!(id(&m.mnt("big")).1, 8, "eight names through the mount");
    // The status lines keep the SPEC's format; --json adds the sizes.
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "A big\nA link2\nA link3\nA link4\nA link5\nA link6\nA link7\nA new/ (1 entry)\nA sparse\n"
    );
    let js: serde_json::Value =
        serde_json::from_str(&stage(&["status", "--json"], &dir).stdout).unwrap();
    let of = |p: &str| {
        js.as_array()
            .unwrap()
            .iter()
            .find(|c| c["path"] == p)
            .unwrap_or_else(|| panic!("{p} in {js}"))
            .clone()
    };
    let sp = of("sparse");
    assert_eq!(sp["size"], 64 * MIB as u64, "{sp}");
    assert_eq!(sp["sparse"], true, "{sp}");
    assert!(sp["allocated"].as_u64().unwrap() < MIB as u64, "{sp}");
    let b = of("big");
    assert_eq!(b["size"], 4 * MIB as u64, "{b}");
    assert!(b.get("sparse").is_none(), "{b}");
    let mut new = of("new");
    let review = new.as_object_mut().unwrap().remove("id").unwrap();
    assert_eq!(review.as_str().unwrap().len(), 16, "{review}");
    assert_eq!(
        new,
        serde_json::json!({"path":"new","change":"added","conflict":false,"entries":1})
    );
    let diff = stage(&["diff"], &dir).stdout;
    let line = diff
        .lines()
        .find(|l| l.starts_with("Binary files /dev/null and b/sparse"))
        .unwrap_or_else(|| panic!("no binary line for sparse in:\n{diff}"));
    assert!(
        line.starts_with("Binary files /dev/null and b/sparse (64 MiB, sparse: ")
            && line.ends_with(" allocated) differ"),
        "{line}"
    );
    assert!(
        diff.contains("Binary files /dev/null and b/big (4 MiB) differ\n"),
        "{diff}"
    );
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);

    let t = std::time::Instant::now();
    let out = stage(&["apply"], &dir);
    out.assert_ok("apply");
    eprintln!("apply took {:?}", t.elapsed());
    assert!(holds(&m.host("sparse"), &sparse_bytes()), "sparse's bytes");
    let a = allocated(&m.host("sparse"));
    assert!(
        a < MIB as u64,
        "SOURCE's sparse file has {a} bytes allocated"
    );
    let names = [
        "big",
        "link2",
        "link3",
        "link4",
        "link5",
        "link6",
        "link7",
        "new/inner",
    ];
    let first = id(&m.host("big"));
    assert_eq!(first.1, 8, "one SOURCE file with eight names");
    for n in names {
        assert_eq!(id(&m.host(n)), first, "{n} is a link of big");
        assert!(holds(&m.host(n), &big), "{n}'s bytes");
    }
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after apply:\n{d}");
    assert_eq!(temporaries(&m.host("")), Vec::<String>::new());
    assert_eq!(stage(&["status"], &dir).stdout, "", "nothing staged");
    // A new daemon on DIR shows the same merged view.
    let second = Second::start(&m, &dir, &m.policy_path());
    let d = snapshot_diff(&merged, &snapshot(&second.mnt));
    assert!(d.is_empty(), "merged view after apply:\n{d}");
    assert_eq!(id(&second.mnt("link7")).1, 8);
    drop(second);
}

#[test]
fn an_apply_of_one_name_of_a_linked_file_leaves_the_others_staged_and_correct() {
    let (mut m, dir) = staged("stage-space-partial", WRITE, staged_sample);
    m.sh("set -e; head -c 4M /dev/urandom > big; ln big l2; ln big l3")
        .assert_ok("stage three names of one file");
    let data = fs::read(m.mnt("big")).unwrap();
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    let out = stage(&["apply", "l2"], &dir);
    out.assert_ok("apply l2");
    assert_eq!(out.stdout, "applied A l2\n");
    assert!(holds(&m.host("l2"), &data));
    assert_eq!(id(&m.host("l2")).1, 1, "the only name of it in SOURCE");
    assert!(!m.host("big").exists() && !m.host("l3").exists());
    assert_eq!(stage(&["status"], &dir).stdout, "A big\nA l3\n");
    // The other names are still staged, one file holding the bytes.
    let up = dir.join("upper");
    assert_eq!(id(&up.join("big")), (id(&up.join("l3")).0, 2));
    assert!(holds(&up.join("l3"), &data));
    let second = Second::start(&m, &dir, &m.policy_path());
    let d = snapshot_diff(&merged, &snapshot(&second.mnt));
    assert!(d.is_empty(), "merged view after a partial apply:\n{d}");
    drop(second);
    // The rest: linked to each other (the name applied before stays a file of its own).
    stage(&["apply"], &dir).assert_ok("apply the rest");
    assert_eq!(id(&m.host("big")), (id(&m.host("l3")).0, 2));
    assert_ne!(id(&m.host("l2")).0, id(&m.host("big")).0);
    for n in ["big", "l2", "l3"] {
        assert!(holds(&m.host(n), &data), "{n}'s bytes");
    }
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after both applies:\n{d}");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn a_crash_between_the_renames_of_a_linked_files_names_loses_none_of_them() {
    let (mut m, dir) = staged("stage-space-crash", WRITE, staged_sample);
    m.sh("set -e; head -c 1M /dev/urandom > big; ln big l2; ln big l3")
        .assert_ok("stage three names of one file");
    let data = fs::read(m.mnt("big")).unwrap();
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    // What an apply (pid 4000000) killed after renaming its first name leaves: `big`
    // in SOURCE (the staged file's bytes, mode, owner and times), `l2`'s temporary entry
    // a link of it, `l3`'s not made yet, all three in its intent log.
    sh_in(
        &m.host(""),
        &format!(
            "set -e; cp -p {up}/big big; ln big .l2.fencefs-apply-4000000",
            up = dir.join("upper").display()
        ),
    )
    .assert_ok("the dead apply's SOURCE side");
    fs::write(
        dir.join("apply-intent"),
        b"fencefs-apply 1 4000000\nbig\0l2\0l3\0",
    )
    .unwrap();
    // A new daemon recovers: the temporary entry goes, `big` (applied) is unstaged, the
    // other two stay staged with their bytes, the merged view is what it was.
    let second = Second::start(&m, &dir, &m.policy_path());
    assert_eq!(temporaries(&m.host("")), Vec::<String>::new());
    assert_eq!(id(&m.host("big")).1, 1);
    assert_eq!(stage(&["status"], &dir).stdout, "A l2\nA l3\n");
    let d = snapshot_diff(&merged, &snapshot(&second.mnt));
    assert!(d.is_empty(), "merged view after recovery:\n{d}");
    drop(second);
    stage(&["apply"], &dir).assert_ok("apply the rest");
    assert_eq!(id(&m.host("l2")), (id(&m.host("l3")).0, 2));
    for n in ["big", "l2", "l3"] {
        assert!(holds(&m.host(n), &data), "{n}'s bytes");
    }
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after the last apply:\n{d}");
    assert_eq!(stage(&["status"], &dir).stdout, "");
    assert!(!dir.join("apply-intent").exists());
}

/// `fencefs stage OP SOCKET ARGS…` (through the running mount).
fn via(sock: &Path, op: &str, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into(), sock.into()];
    v.extend(args.iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// `names` under `root` grouped by inode (each group sorted, groups sorted).
fn one_file_groups(root: &Path, names: &[&str]) -> Vec<Vec<String>> {
    let mut by: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    for n in names {
        by.entry(id(&root.join(n)).0)
            .or_default()
            .push(n.to_string());
    }
    let mut out: Vec<Vec<String>> = by.into_values().collect();
    out.sort();
    out
}

#[test]
fn a_live_apply_over_a_checkpoint_keeps_holes_and_links_and_the_view() {
    // Names made before and after a checkpoint: the apply squashes the layers first (a
    // flattened tree of hard links to the layers' files), then writes. The checkpoint
    // seals `big` and `l2`; `ln big l3` after it copies `big` up (overlayfs breaks a link
    // on copy-up), so the staged tree holds `big` and `l3` as one file and `l2` as
    // another, and SOURCE gets the same. (Not compared through the mount's inode
    // numbers: overlayfs gives a copied-up file its origin's number, so there `big`
    // shows the sealed file's, the one `l2` has.)
    let (m, dir, sock) = staged_live("stage-space-live", staged_sample);
    m.sh("set -e; head -c 2M /dev/urandom > big; ln big l2")
        .assert_ok("the first turn");
    via(&sock, "checkpoint", &[]).assert_ok("checkpoint");
    m.sh(&format!("set -e; ln big l3; {MAKE_SPARSE}"))
        .assert_ok("the second turn");
    let data = fs::read(m.mnt("big")).unwrap();
    let merged = snapshot(&m.mnt(""));
    let names = ["big", "l2", "l3"];
    let sealed = dir.join("layers/1");
    assert_eq!(id(&sealed.join("big")), (id(&sealed.join("l2")).0, 2));
    let up = dir.join("upper");
    assert_eq!(id(&up.join("big")), (id(&up.join("l3")).0, 2));
    let groups = [vec!["big", "l3"], vec!["l2"]];
    let out = via(&sock, "apply", &[]);
    out.assert_ok("live apply");
    assert_eq!(
        out.stdout,
        "applied A big\napplied A l2\napplied A l3\napplied A sparse\n"
    );
    assert!(holds(&m.host("sparse"), &sparse_bytes()));
    let a = allocated(&m.host("sparse"));
    assert!(
        a < MIB as u64,
        "SOURCE's sparse file has {a} bytes allocated"
    );
    assert_eq!(one_file_groups(&m.host(""), &names), groups);
    assert_eq!(id(&m.host("big")), (id(&m.host("l3")).0, 2));
    assert_eq!(id(&m.host("l2")).1, 1);
    for n in names {
        assert!(holds(&m.host(n), &data), "{n}'s bytes");
    }
    let d = snapshot_diff(&merged, &snapshot(&m.mnt("")));
    assert!(d.is_empty(), "the merged view after a live apply:\n{d}");
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after a live apply:\n{d}");
    assert_eq!(via(&sock, "status", &[]).stdout, "");
    assert_eq!(temporaries(&m.host("")), Vec::<String>::new());
}
