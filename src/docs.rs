//! Man pages and shell completions, generated from the clap definition (`fencefs
//! generate-docs DIR`, run by scripts/package.sh; the output is a build artifact).
//!
//! - `man/fencefs.1`: every subcommand with every option (clap_mangen renders the
//!   synopses and option lists), the mount(8) form with every `-o` option
//!   ([`crate::fuse_opts`]), signals, exit status, files.
//! - `man/fencefs-policy.5`: the policy format, written by hand in `doc/` (a test keeps it
//!   and the book's policy chapter, docs/src/policy.md, in step with the parser's keys).
//! - `completions/fencefs.bash`, `_fencefs` (zsh), `fencefs.fish`: clap_complete.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;
use roff::{Roff, bold, italic, roman};

use crate::cli::{Cli, VERSION};
use crate::fuse_opts;

/// The policy man page (hand-written roff).
pub const POLICY_MAN: &str = include_str!("../doc/fencefs-policy.5");

/// Writes every page and completion under `dir`; returns the files written.
pub fn generate(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let man = dir.join("man");
    let comp = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&comp)?;
    let mut out = vec![];
    let mut put = |p: PathBuf, bytes: &[u8]| -> io::Result<()> {
        std::fs::write(&p, bytes)?;
        out.push(p);
        Ok(())
    };
    put(man.join("fencefs.1"), &fencefs_1()?)?;
    put(man.join("fencefs-policy.5"), POLICY_MAN.as_bytes())?;
    for (shell, name) in [
        (Shell::Bash, "fencefs.bash"),
        (Shell::Zsh, "_fencefs"),
        (Shell::Fish, "fencefs.fish"),
    ] {
        put(comp.join(name), &completion(shell))?;
    }
    let schema = dir.join("schema");
    std::fs::create_dir_all(&schema)?;
    put(
        schema.join("fencefs-policy.schema.json"),
        crate::policy::schema::json().as_bytes(),
    )?;
    Ok(out)
}

/// The completion script for `shell`.
pub fn completion(shell: Shell) -> Vec<u8> {
    let mut buf = vec![];
    clap_complete::generate(shell, &mut Cli::command(), "fencefs", &mut buf);
    buf
}

/// A clap_mangen section of `cmd` without its `.SH` heading lines.
fn section_body(
    cmd: &clap::Command,
    render: impl Fn(&clap_mangen::Man, &mut dyn Write) -> io::Result<()>,
) -> io::Result<String> {
    let mut buf = vec![];
    render(&clap_mangen::Man::new(cmd.clone()), &mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    Ok(text
        .lines()
        .filter(|l| !l.starts_with(".SH"))
        .map(|l| format!("{l}\n"))
        .collect())
}

fn para(r: &mut Roff, text: &str) {
    r.control("PP", []);
    r.text([roman(text)]);
}

fn item(r: &mut Roff, head: Vec<roff::Inline>, text: &str) {
    r.control("TP", []);
    r.text(head);
    r.text([roman(text)]);
}

/// fencefs(1).
pub fn fencefs_1() -> io::Result<Vec<u8>> {
    let mut cli = Cli::command();
    cli.build();
    let subs: Vec<clap::Command> = cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| s.clone().bin_name(format!("fencefs {}", s.get_name())))
        .collect();
    let mut page = String::new();

    let mut r = Roff::new();
    r.control(
        "TH",
        [
            "FENCEFS",
            "1",
            "",
            concat!("fencefs ", env!("CARGO_PKG_VERSION")),
            "fencefs",
        ],
    );
    r.control("SH", ["NAME"]);
    r.text([roman(
        "fencefs - a FUSE mirror of a workspace where a policy decides every operation",
    )]);
    r.control("SH", ["SYNOPSIS"]);
    page.push_str(&r.to_roff());
    for s in &subs {
        page.push_str(&section_body(s, |m, w| m.render_synopsis_section(w))?);
        page.push_str(".br\n");
    }
    let mut r = Roff::new();
    r.text([
        bold("fencefs"),
        roman(" "),
        italic("SOURCE"),
        roman(" "),
        italic("MOUNTPOINT"),
        roman(" ["),
        bold("-o"),
        roman(" "),
        italic("OPTION"),
        roman("[,"),
        italic("OPTION"),
        roman("...]]"),
    ]);
    r.control("br", []);
    r.text([
        bold("mount -t fuse.fencefs"),
        roman(" "),
        italic("SOURCE MOUNTPOINT"),
        roman(" "),
        bold("-o"),
        roman(" "),
        italic("OPTIONS"),
    ]);
    r.control("br", []);
    r.text([bold("fencefs --version")]);
    r.control("SH", ["DESCRIPTION"]);
    para(
        &mut r,
        "fencefs mirrors a host directory (the workspace, SOURCE) at MOUNTPOINT and decides \
         every lookup, read, write, rename, unlink and every other operation against a TOML \
         policy of per-path grants and a sandbox mode (read-only, workspace-write, danger); \
         see fencefs-policy(5). Programs see an ordinary directory; what the policy forbids \
         fails with an ordinary errno (ENOENT for hidden paths, EACCES for a rule, EROFS for \
         the mode, EPERM for device nodes and set-ID bits), and the host stays untouched.",
    );
    para(
        &mut r,
        "The mount is nosuid,nodev. Run as root with --allow-other to serve other uids \
         (containers); files they create then belong to them on the host.",
    );
    r.control("SH", ["COMMANDS"]);
    page.push_str(&r.to_roff());
    for s in &subs {
        let mut r = Roff::new();
        r.control("SS", [format!("fencefs {}", s.get_name()).as_str()]);
        let about = s
            .get_long_about()
            .or_else(|| s.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        r.text([roman(about)]);
        r.control("PP", []);
        r.text([roman("Options and arguments:")]);
        page.push_str(&r.to_roff());
        page.push_str(&section_body(s, |m, w| m.render_options_section(w))?);
    }

    let mut r = Roff::new();
    r.control("SH", ["MOUNT(8) AND FSTAB"]);
    para(
        &mut r,
        "mount -t fuse.fencefs SOURCE MOUNTPOINT -o OPTIONS, and /etc/fstab lines of type \
         fuse.fencefs, run mount.fuse3(8), which runs fencefs SOURCE MOUNTPOINT -o OPTIONS. \
         fencefs then mounts like fencefs mount and puts itself in the background: mount(8) \
         returns 0 once the mount answers requests, printing nothing, or fails with the \
         error on one line. umount(8) unmounts it, and the daemon exits. Log lines go to \
         systemd's journal when mount(8) ran under systemd (fstab at boot, .mount units) \
         or to stderr when it is a regular file; on a terminal or a pipe only warnings and \
         errors are printed (RUST_LOG overrides), and in the background nothing (use \
         audit=FILE, or fencefs mount in the foreground). The mount table (findmnt, df) \
         shows SOURCE as the mount's source.",
    );
    para(
        &mut r,
        "Example fstab line: /srv/work /run/fencefs/work fuse.fencefs \
         policy=/etc/fencefs/work.toml,allow_other 0 0",
    );
    para(
        &mut r,
        "Every fencefs mount option is an -o option, spelled with _ for - and with =VALUE \
         for a value; an unknown option is an error that names it:",
    );
    for o in fuse_opts::options() {
        let mut head = vec![bold(o.name.clone())];
        if let Some(v) = &o.value {
            head.push(roman("="));
            head.push(italic(v.clone()));
        }
        let mut help = format!("--{}: {}", o.long, o.help);
        if o.repeat && !o.help.contains("repeatable") {
            help.push_str(" May be repeated.");
        }
        item(&mut r, head, &help);
    }
    para(&mut r, "Generic mount options:");
    for (g, what) in fuse_opts::GENERIC {
        item(&mut r, vec![bold(*g)], what);
    }
    item(
        &mut r,
        vec![
            bold("x-"),
            italic("*"),
            roman(", "),
            bold("comment="),
            italic("*"),
        ],
        "userspace options for mount(8) and systemd (x-systemd.automount, \
         x-systemd.requires=..., x-mount.mkdir): ignored",
    );
    para(
        &mut r,
        "mount.fuse3 handles setuid=USER and drop_privileges itself, and removes auto, \
         noauto, nofail, _netdev, user, users and nouser before fencefs sees them.",
    );

    r.control("SH", ["SIGNALS"]);
    item(
        &mut r,
        vec![bold("SIGHUP")],
        "re-read the policy file (an invalid file changes nothing and is logged) and reopen \
         the audit file (for logrotate).",
    );
    item(
        &mut r,
        vec![bold("SIGINT"), roman(", "), bold("SIGTERM")],
        "unmount (lazily if busy) and exit 0.",
    );
    r.control("SH", ["ENVIRONMENT"]);
    item(
        &mut r,
        vec![bold("RUST_LOG")],
        "log filter (default info); log lines go to stderr.",
    );
    item(
        &mut r,
        vec![bold("NOTIFY_SOCKET")],
        "when set, fencefs mount sends READY=1 once the mount answers requests \
         (systemd Type=notify).",
    );
    r.control("SH", ["EXIT STATUS"]);
    r.text([roman(
        "0 on success and after a clean unmount; 1 for runtime and policy errors; 2 for \
         usage errors (bad arguments or -o options).",
    )]);
    r.control("SH", ["FILES"]);
    item(
        &mut r,
        vec![
            italic("/etc/fencefs/NAME.toml"),
            roman(", "),
            italic("/etc/fencefs/NAME.env"),
        ],
        "policy and SOURCE, MOUNTPOINT, OPTIONS of the systemd unit fencefs@NAME.service.",
    );
    item(
        &mut r,
        vec![italic("/var/log/fencefs/NAME.jsonl")],
        "the unit's audit log (rotated by size by fencefs, by date by logrotate).",
    );
    item(
        &mut r,
        vec![italic("/usr/share/doc/fencefs/policy.example.toml")],
        "a commented example policy.",
    );
    r.control("SH", ["SEE ALSO"]);
    r.text([roman(
        "fencefs-policy(5), mount.fuse3(8), fusermount3(1), fstab(5), systemd.mount(5), \
         logrotate(8)",
    )]);
    r.control("SH", ["VERSION"]);
    r.text([roman(VERSION)]);
    page.push_str(&r.to_roff());
    Ok(page.into_bytes())
}
