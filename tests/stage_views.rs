//! Files held open across live changes of a staged mount (the daemon's own engine): a
//! file open for writing across a live checkpoint writes into the live layer, never the
//! sealed one (`status --since N` shows it, `rewind N` drops it, `DIR/layers/N` never
//! changes); a read-only file keeps reading; the conflict rule still holds after a
//! rewind to the checkpoint's copy; a held file with two names stays out of every sealed
//! layer. SOURCE stays untouched.

mod common;

use std::fs::{self, File, OpenOptions};
use std::path::Path;

use common::stage::*;
use common::*;

fn checkpoint(sock: &Path) {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), "checkpoint".into()];
    v.push(sock.into());
    run_fencefs(v, LIMIT).assert_ok("live checkpoint");
}

/// A staged live mount (with `extra` mount arguments) of the sample SOURCE.
fn mount(name: &str, extra: &[&str]) -> (Mount, std::path::PathBuf) {
    let mut b = Mount::builder(name).policy(WRITE);
    sample(&b.host(""));
    for a in extra {
        b = b.arg(a);
    }
    let (m, _, sock) = start_staged_live(b);
    (m, sock)
}

fn stage_cmd(sock: &Path, op: &str, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into()];
    v.push(sock.into());
    v.extend(args.iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// A file opened for writing before checkpoint 1 and written after it: the write lands
/// in the live layer (`status --since 1` shows it, `rewind 1` drops it), and checkpoint
/// 1's layer in DIR keeps the bytes it had at the checkpoint, before and after the rewind
/// and whatever the old descriptor writes afterwards. A file open read-only across it
/// keeps reading.
fn held_writer_keeps_the_checkpoint_sealed(name: &str, extra: &[&str]) {
    use std::os::unix::fs::FileExt;
    let (m, sock) = mount(name, extra);
    let dir = sock.parent().unwrap().join("stage");
    let before = snapshot(&m.host(""));
    let w = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.mnt("a.txt"))
        .unwrap();
    w.write_all_at(b"ONE", 0).unwrap();
    let r = File::open(m.mnt("sub/b.txt")).unwrap();
    let c = stage_cmd(&sock, "checkpoint", &[]);
    c.assert_ok("checkpoint");
    assert_eq!(c.stdout, "checkpoint 1\n");
    let sealed = dir.join("layers/1/a.txt");
    let at_checkpoint = fs::read(&sealed).unwrap();
    assert_eq!(at_checkpoint, b"ONE\ntwo\nthree\n");
    // Written through the descriptor opened before the checkpoint.
    w.write_all_at(b"TWO", 4).unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\nTWO\nthree\n");
    let st = stage_cmd(&sock, "status", &["--since", "1"]);
    st.assert_ok("status --since 1");
    assert_eq!(st.stdout, "M a.txt\n", "the write after checkpoint 1");
    assert_eq!(fs::read(&sealed).unwrap(), at_checkpoint, "layer 1 changed");
    let mut buf = [0u8; 4];
    r.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(
        &buf, b"bee\n",
        "a read-only file held across the checkpoint"
    );
    stage_cmd(&sock, "rewind", &["1"]).assert_ok("rewind 1");
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\ntwo\nthree\n");
    assert_eq!(
        fs::read(&sealed).unwrap(),
        at_checkpoint,
        "layer 1 after rewind"
    );
    // The old descriptor goes on writing, into nothing staged.
    w.write_all_at(b"THREE", 8).unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\ntwo\nthree\n");
    assert_eq!(
        fs::read(&sealed).unwrap(),
        at_checkpoint,
        "layer 1 after more writes"
    );
    assert_eq!(stage_cmd(&sock, "status", &["--since", "1"]).stdout, "");
    // Held across a second checkpoint too: still the live layer's, layer 1 and 2 sealed.
    let w2 = OpenOptions::new().write(true).open(m.mnt("a.txt")).unwrap();
    stage_cmd(&sock, "checkpoint", &[]).assert_ok("checkpoint 2");
    stage_cmd(&sock, "checkpoint", &[]).assert_ok("checkpoint 3");
    w2.write_all_at(b"FOUR", 4).unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\nFOURthree\n");
    assert_eq!(
        stage_cmd(&sock, "status", &["--since", "3"]).stdout,
        "M a.txt\n"
    );
    // Checkpoint 3's layer holds a.txt as it was then (a copy), untouched by that write.
    assert_eq!(
        fs::read(dir.join("layers/3/a.txt")).unwrap(),
        b"ONE\ntwo\nthree\n"
    );
    assert_eq!(fs::read(&sealed).unwrap(), at_checkpoint);
    drop((w, w2, r));
    assert_host_unchanged(&before, &m.host(""), "writes held across checkpoints");
}

#[test]
fn a_file_written_across_a_checkpoint_leaves_the_sealed_layer_unchanged() {
    held_writer_keeps_the_checkpoint_sealed("stage-views-sealed", &[]);
}

#[test]
fn without_passthrough_a_file_written_across_a_checkpoint_leaves_it_sealed() {
    held_writer_keeps_the_checkpoint_sealed("stage-views-sealed-np", &["--no-passthrough"]);
}

/// The conflict rule after a rewind to a checkpoint that copied a file held open for
/// writing: the copy is born at the checkpoint, but it stands for the entry staged
/// before, so a host edit made between the two is still a conflict.
#[test]
fn a_host_edit_before_the_checkpoint_of_a_held_file_stays_a_conflict_after_rewind() {
    use std::os::unix::fs::FileExt;
    let (m, sock) = mount("stage-views-conflict", &[]);
    let pause = || std::thread::sleep(std::time::Duration::from_millis(50));
    let w = OpenOptions::new().write(true).open(m.mnt("a.txt")).unwrap();
    w.write_all_at(b"ONE", 0).unwrap();
    pause();
    // The host edits SOURCE's a.txt after it was staged.
    fs::write(m.host("a.txt"), b"host edit\n").unwrap();
    pause();
    checkpoint(&sock);
    let st = stage_cmd(&sock, "status", &[]);
    assert_eq!(st.stdout, "CM a.txt\n", "before the rewind");
    drop(w);
    stage_cmd(&sock, "rewind", &["1"]).assert_ok("rewind 1");
    let st = stage_cmd(&sock, "status", &[]);
    assert_eq!(
        st.stdout, "CM a.txt\n",
        "after the rewind (the sealed copy)"
    );
}

/// A file held open for writing that has two names (a hard link made through the mount),
/// then is renamed after a checkpoint: each checkpoint finds it under every name it has
/// then (a walk of the layer) and keeps them all sealed.
#[test]
fn a_held_file_with_two_names_then_renamed_stays_out_of_every_sealed_layer() {
    use std::os::unix::fs::FileExt;
    let (m, sock) = mount("stage-views-links", &[]);
    let dir = sock.parent().unwrap().join("stage");
    let w = OpenOptions::new()
        .write(true)
        .open(m.mnt("sub/b.txt"))
        .unwrap();
    w.write_all_at(b"BEE", 0).unwrap();
    fs::hard_link(m.mnt("sub/b.txt"), m.mnt("b2.txt")).unwrap();
    checkpoint(&sock);
    let l1 = |p: &str| fs::read(dir.join("layers/1").join(p)).unwrap();
    w.write_all_at(b"ONE", 0).unwrap();
    assert_eq!(l1("sub/b.txt"), b"BEE\n");
    assert_eq!(l1("b2.txt"), b"BEE\n");
    assert_eq!(fs::read(m.mnt("sub/b.txt")).unwrap(), b"ONE\n");
    assert_eq!(fs::read(m.mnt("b2.txt")).unwrap(), b"ONE\n");
    // Renamed in the live view: the next checkpoint finds it under its new name.
    fs::rename(m.mnt("b2.txt"), m.mnt("sub/deep/moved.txt")).unwrap();
    checkpoint(&sock);
    w.write_all_at(b"TWO", 0).unwrap();
    let l2 = |p: &str| fs::read(dir.join("layers/2").join(p)).unwrap();
    assert_eq!(l2("sub/deep/moved.txt"), b"ONE\n");
    assert_eq!(l2("sub/b.txt"), b"ONE\n");
    assert_eq!(l1("sub/b.txt"), b"BEE\n");
    assert_eq!(fs::read(m.mnt("sub/deep/moved.txt")).unwrap(), b"TWO\n");
    let st = stage_cmd(&sock, "status", &["--since", "2"]);
    assert_eq!(st.stdout, "M sub/b.txt\nM sub/deep/moved.txt\n");
    stage_cmd(&sock, "rewind", &["2"]).assert_ok("rewind 2");
    assert_eq!(fs::read(m.mnt("sub/deep/moved.txt")).unwrap(), b"ONE\n");
    drop(w);
}
