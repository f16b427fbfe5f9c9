//! Hidden paths: absent from listings, lookups and every error.

use super::*;

// ------------------------------------------------------------------ hidden paths

const HIDDEN_POLICY: &str = r#"
default = "write"

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "**/*.pem"
access = "none"

[[rule]]
path = "**/.env"
access = "none"

[[rule]]
path = "vault"
access = "none"

[[rule]]
path = "vault/public"
access = "read"
"#;

fn hidden_layout(src: &Path) {
    put(&src.join("secrets/key"), b"SECRET-KEY\n", 0o644);
    put(&src.join("a/b/c.pem"), b"SECRET-PEM\n", 0o644);
    put(&src.join("a/plain"), b"plain\n", 0o644);
    put(&src.join("a/.env"), b"SECRET-ENV-A\n", 0o644);
    put(&src.join(".env"), b"SECRET-ENV\n", 0o644);
    put(&src.join("top.pem"), b"SECRET-TOP\n", 0o644);
    put(&src.join("vault/secret.txt"), b"SECRET-VAULT\n", 0o644);
    put(&src.join("vault/deeper/x"), b"SECRET-DEEP\n", 0o644);
    put(&src.join("vault/public/readme"), b"public\n", 0o644);
    put(&src.join("README"), b"readme\n", 0o644);
    symlink("../secrets/key", &src.join("a/tosecret"));
}

#[test]
fn hidden_paths_are_enoent_and_unlisted() {
    let m = Mount::with("hidden", Some(HIDDEN_POLICY), Some("danger"), hidden_layout);
    let before = snapshot(&m.host(""));

    for p in [
        "secrets",
        "secrets/key",
        "a/b/c.pem",
        "a/.env",
        ".env",
        "top.pem",
        "vault/secret.txt",
        "vault/deeper",
        "vault/deeper/x",
    ] {
        assert_errno(
            fs::symlink_metadata(m.mnt(p)),
            ENOENT,
            &format!("lstat {p}"),
        )
        .ok();
        assert_errno(fs::File::open(m.mnt(p)), ENOENT, &format!("open {p}")).ok();
    }
    assert_errno(fs::read_dir(m.mnt("secrets")), ENOENT, "opendir secrets").ok();

    let root = names_str(&m.mnt("")).unwrap();
    assert_eq!(root, ["README", "a", "vault"], "root listing");
    assert_eq!(
        names_str(&m.mnt("a")).unwrap(),
        ["b", "plain", "tosecret"],
        "a/ listing"
    );
    assert!(
        names_str(&m.mnt("a/b")).unwrap().is_empty(),
        "a/b should list as empty"
    );

    // `none` dir with a deeper `read` rule: listable, only the visible entry.
    let md = fs::metadata(m.mnt("vault")).expect("vault stays visible (as list)");
    assert!(md.is_dir());
    assert_eq!(
        names_str(&m.mnt("vault")).unwrap(),
        ["public"],
        "vault listing"
    );
    assert_eq!(
        read_all(&m.mnt("vault/public/readme")).unwrap(),
        b"public\n"
    );
    // vault itself is only `list`: creating in it is a none path → EACCES.
    assert_errno(
        open_flags(
            &m.mnt("vault/new"),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o644,
        ),
        EACCES,
        "create vault/new",
    )
    .ok();

    // A symlink into a hidden place is mirrored; resolving it (through the mount) fails.
    assert_eq!(
        fs::read_link(m.mnt("a/tosecret")).unwrap(),
        Path::new("../secrets/key")
    );
    assert_errno(
        fs::read(m.mnt("a/tosecret")),
        ENOENT,
        "read through a/tosecret",
    )
    .ok();

    let ls = m.sh("ls -a . a a/b vault");
    ls.assert_ok("ls -a");
    let find = m.sh("find .");
    find.assert_ok("find .");
    for out in [&ls.stdout, &find.stdout] {
        for bad in ["secrets", ".pem", ".env", "secret.txt", "deeper"] {
            assert!(!out.contains(bad), "{bad:?} leaked into listing:\n{out}");
        }
    }
    assert!(
        find.stdout.lines().any(|l| l == "./vault/public/readme"),
        "find misses vault/public/readme:\n{}",
        find.stdout
    );
    let grep = m.sh("grep -r SECRET . ; true");
    assert!(
        !grep.stdout.contains("SECRET"),
        "grep -r found hidden content:\n{}",
        grep.stdout
    );

    assert_host_unchanged(&before, &m.host(""), "reads of hidden paths");
}

/// Creating a `none` path fails with EACCES and never touches the host, in every mode,
/// whether or not a hidden file of that name exists on the host.
#[test]
fn creating_hidden_paths_is_eacces() {
    for mode in ["read-only", "workspace-write", "danger"] {
        let m = Mount::with(
            &format!("hidden-create-{mode}"),
            Some(HIDDEN_POLICY),
            Some(mode),
            hidden_layout,
        );
        let src = m.host("");
        let before = snapshot(&src);
        let cases: Vec<(&str, BoxedOp)> = vec![
            (
                "create a/new.pem",
                Box::new(|| {
                    open_flags(
                        &m.mnt("a/new.pem"),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                        0o644,
                    )
                }),
            ),
            (
                "create O_EXCL existing hidden top.pem",
                Box::new(|| {
                    open_flags(
                        &m.mnt("top.pem"),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                        0o644,
                    )
                }),
            ),
            (
                "create O_TRUNC existing hidden .env",
                Box::new(|| {
                    open_flags(
                        &m.mnt(".env"),
                        libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY,
                        0o644,
                    )
                }),
            ),
            (
                "create O_TRUNC existing hidden a/.env",
                Box::new(|| {
                    open_flags(
                        &m.mnt("a/.env"),
                        libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY,
                        0o644,
                    )
                }),
            ),
            (
                "create existing hidden dir name secrets",
                Box::new(|| open_flags(&m.mnt("secrets"), libc::O_CREAT | libc::O_WRONLY, 0o644)),
            ),
            (
                "mkdir secrets (exists on host)",
                Box::new(|| mkdir_mode(&m.mnt("secrets"), 0o755)),
            ),
            (
                "mkdir a/d.pem",
                Box::new(|| mkdir_mode(&m.mnt("a/d.pem"), 0o755)),
            ),
            (
                "symlink a/l.pem",
                Box::new(|| std::os::unix::fs::symlink("plain", m.mnt("a/l.pem"))),
            ),
            (
                "mknod fifo a/f.pem",
                Box::new(|| mknod(&m.mnt("a/f.pem"), libc::S_IFIFO | 0o644, 0)),
            ),
        ];
        for (what, f) in cases {
            let r = f();
            assert_errno(r, EACCES, &format!("[{mode}] {what}")).ok();
            assert_host_unchanged(&before, &src, &format!("[{mode}] {what}"));
        }
        if mode == "danger" {
            assert_errno(
                fs::rename(m.mnt("a/plain"), m.mnt("a/b/c.pem")),
                EACCES,
                "rename over hidden a/b/c.pem",
            )
            .ok();
            assert_host_unchanged(&before, &src, "rename over hidden");
            assert_errno(
                fs::rename(m.mnt("a/plain"), m.mnt("a/new.pem")),
                EACCES,
                "rename to hidden name",
            )
            .ok();
            assert_errno(
                fs::hard_link(m.mnt("a/plain"), m.mnt("a/h.pem")),
                EACCES,
                "link to hidden name",
            )
            .ok();
            assert_errno(
                fs::hard_link(m.mnt("a/plain"), m.mnt(".env")),
                EACCES,
                "link over hidden .env",
            )
            .ok();
            assert_errno(
                renameat2(&m.mnt("a/plain"), &m.mnt("top.pem"), libc::RENAME_EXCHANGE),
                // RENAME_EXCHANGE needs an existing target: a hidden one does not exist.
                ENOENT,
                "exchange with hidden top.pem",
            )
            .ok();
            assert_host_unchanged(&before, &src, "rename/link to hidden names");
            // And the visible file itself is still fine to rename.
            fs::rename(m.mnt("a/plain"), m.mnt("a/plain2"))
                .expect("rename a visible file in danger");
            assert!(m.host("a/plain2").exists());
        }
    }
}
