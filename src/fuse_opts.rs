//! mount(8)'s calling convention: `fencefs SOURCE MOUNTPOINT -o OPTIONS`. PURE (no I/O).
//!
//! `mount -t fuse.fencefs SOURCE MOUNTPOINT -o ...` and `/etc/fstab` lines of type
//! `fuse.fencefs` run mount.fuse3 (`/sbin/mount.fuse`), which execs
//! `fencefs SOURCE MOUNTPOINT -o OPTIONS` after removing the options meant for mount(8)
//! itself (`auto`, `noauto`, `nofail`, `_netdev`, `user`, `users`, `nouser`, `setuid=`,
//! `drop_privileges`) and appending `dev` and `suid` unless `nodev`/`nosuid` were given.
//!
//! Every `fencefs mount` option is an `-o` option, its long name with `_` for `-`:
//! `--policy FILE` is `policy=FILE`, `--allow-other` is `allow_other`, `--map-uid C:H`
//! is `map_uid=C:H` (repeatable). They are read from the clap definition itself, so a new
//! `mount` option is an `-o` option at once, and the result is the very [`MountArgs`] that
//! `fencefs mount` would parse. The generic options of [`GENERIC`] are accepted for
//! mount(8)'s sake; anything else is an error naming the option.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::{ArgAction, CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command, MountArgs};

/// `mount` options that are not `-o` options: set by the mount-helper path itself, or
/// meaningless there (a mount(8) mount is never handed over).
const NOT_OPTIONS: &[&str] = &["ready-fd", "fuse-fd-from"];

/// Generic mount options fencefs accepts, and what they do. `x-*` and `comment=*` are
/// accepted too (userspace options for mount(8) and systemd, e.g. `x-systemd.automount`).
pub const GENERIC: &[(&str, &str)] = &[
    (
        "rw",
        "accepted; what may be written is decided by the policy and its mode",
    ),
    ("ro", "the same as mode=read-only"),
    (
        "dev",
        "accepted; the mount is always nodev (mount.fuse3 adds dev by default)",
    ),
    ("nodev", "accepted; the mount is always nodev"),
    (
        "suid",
        "accepted; the mount is always nosuid (mount.fuse3 adds suid by default)",
    ),
    ("nosuid", "accepted; the mount is always nosuid"),
    ("exec", "accepted; executing a file needs read access"),
    ("async", "accepted"),
    ("defaults", "accepted (an fstab placeholder)"),
    ("auto", "for mount -a; ignored"),
    ("noauto", "for mount -a; ignored"),
    ("nofail", "for mount(8) and systemd; ignored"),
    ("_netdev", "for systemd; ignored"),
    ("user", "for mount(8); ignored"),
    ("users", "for mount(8); ignored"),
    ("nouser", "for mount(8); ignored"),
];

/// The `-o` name of a `mount` option's long flag: `allow-other` → `allow_other`.
fn o_name(long: &str) -> String {
    long.replace('-', "_")
}

/// One `fencefs mount` option as an `-o` option.
pub struct OOption {
    /// `-o` name (`allow_other`).
    pub name: String,
    /// The long flag it stands for (`allow-other`).
    pub long: String,
    /// Value name when it takes a value (`FILE`), `None` for a switch.
    pub value: Option<String>,
    /// May be given more than once.
    pub repeat: bool,
    /// The flag's help text.
    pub help: String,
}

/// Every `-o` option fencefs has, from the clap definition of `fencefs mount`.
pub fn options() -> Vec<OOption> {
    let cli = Cli::command();
    let Some(mount) = cli.find_subcommand("mount") else {
        return vec![];
    };
    mount
        .get_arguments()
        .filter(|a| !a.is_positional() && !a.is_hide_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            if NOT_OPTIONS.contains(&long) || matches!(a.get_action(), ArgAction::Help) {
                return None;
            }
            let takes = a.get_action().takes_values();
            Some(OOption {
                name: o_name(long),
                long: long.to_string(),
                value: takes.then(|| {
                    a.get_value_names()
                        .and_then(|v| v.first())
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "VALUE".into())
                }),
                repeat: matches!(a.get_action(), ArgAction::Append),
                help: a.get_help().map(|h| h.to_string()).unwrap_or_default(),
            })
        })
        .collect()
}

/// Whether argv (with `argv[0]`) is mount(8)'s `SOURCE MOUNTPOINT [-o OPTS]` form rather than
/// a subcommand: at least two arguments, the first neither a subcommand nor a flag, and a
/// path (it has a `/` or `exists` says it is there). So a mistyped subcommand
/// (`fencefs chek p.toml`) still gets clap's "unrecognized subcommand".
pub fn is_helper_form(args: &[OsString], exists: impl Fn(&Path) -> bool) -> bool {
    let Some(first) = args.get(1) else {
        return false;
    };
    if args.len() < 3 || first.as_encoded_bytes().starts_with(b"-") {
        return false;
    }
    let cli = Cli::command();
    let is_sub = first == "help"
        || cli
            .get_subcommands()
            .any(|s| s.get_name() == first || s.get_all_aliases().any(|a| a == first.as_os_str()));
    !is_sub && (first.as_encoded_bytes().contains(&b'/') || exists(Path::new(first)))
}

/// Parses `SOURCE MOUNTPOINT [-o OPTS]...` (argv without `argv[0]`) into the arguments of
/// `fencefs mount`. Errors name the offending option or argument.
pub fn parse(args: &[OsString]) -> Result<MountArgs, String> {
    let argv = to_mount_argv(args)?;
    let mut cmd = Cli::command();
    let matches = cmd
        .try_get_matches_from_mut(&argv)
        .map_err(|e| clap_error(&e))?;
    match Cli::from_arg_matches(&matches).map_err(|e| clap_error(&e))? {
        Cli {
            command: Command::Mount(m),
        } => Ok(m),
        _ => Err("internal error: -o options did not parse as `mount`".into()),
    }
}

/// clap's message (on one line, without "error: "), with `--long-flag` spelled as the
/// `-o` option it came from.
fn clap_error(e: &clap::Error) -> String {
    let text = e.to_string();
    // The message and its indented details, up to the usage and tips.
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Usage:"))
        .map(str::trim)
        .collect();
    let line = lines.join(" ");
    let mut msg = line.strip_prefix("error: ").unwrap_or(&line).to_string();
    for o in options() {
        let flag = format!("--{}", o.long);
        let with_value = o
            .value
            .as_ref()
            .map(|v| format!("{flag} <{v}>"))
            .unwrap_or_else(|| flag.clone());
        let as_o = match &o.value {
            Some(v) => format!("{}={v}", o.name),
            None => o.name.clone(),
        };
        msg = msg.replace(&with_value, &as_o).replace(&flag, &as_o);
    }
    format!("-o options: {msg}")
}

/// The `fencefs mount` argv equivalent to `SOURCE MOUNTPOINT [-o OPTS]...`.
pub fn to_mount_argv(args: &[OsString]) -> Result<Vec<OsString>, String> {
    const USAGE: &str = "usage: fencefs SOURCE MOUNTPOINT [-o OPTION[,OPTION...]]";
    let mut positional: Vec<&OsString> = vec![];
    let mut opts: Vec<String> = vec![];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let b = a.as_encoded_bytes();
        if b == b"-o" {
            let v = it
                .next()
                .ok_or_else(|| format!("-o needs a value ({USAGE})"))?;
            opts.push(utf8(v)?);
        } else if let Some(rest) = b.strip_prefix(b"-o") {
            opts.push(utf8(OsStr::from_bytes(rest))?);
        } else if b.starts_with(b"-") {
            return Err(format!(
                "unexpected argument '{}' ({USAGE})",
                a.to_string_lossy()
            ));
        } else {
            positional.push(a);
        }
    }
    let [source, mountpoint] = positional[..] else {
        return Err(format!(
            "expected SOURCE and MOUNTPOINT, got {} argument(s) ({USAGE})",
            positional.len()
        ));
    };
    let known = options();
    let mut argv: Vec<OsString> = vec!["fencefs".into(), "mount".into()];
    let mut mode: Option<String> = None;
    let mut ro = false;
    let mut seen: Vec<&str> = vec![];
    for opt in opts.iter().flat_map(|o| o.split(',')) {
        // mount(8) may pass an option twice (fstab's and the command line's): the same
        // text twice is once. Two different values of one option stay an error (clap's).
        if seen.contains(&opt) {
            continue;
        }
        seen.push(opt);
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        if opt.is_empty() || opt.starts_with("x-") || name == "comment" {
            continue;
        }
        if let Some((g, _)) = GENERIC.iter().find(|(g, _)| *g == name) {
            if value.is_some() {
                return Err(format!("mount option '{g}' takes no value: '{opt}'"));
            }
            ro |= *g == "ro";
            continue;
        }
        let Some(o) = known.iter().find(|o| o.name == name) else {
            let hint = known
                .iter()
                .find(|o| o.long == name)
                .map(|o| format!(" (did you mean '{}'?)", o.name))
                .unwrap_or_default();
            return Err(format!(
                "unknown mount option '{name}'{hint}; fencefs options: {} \
                 (and generic mount options: see fencefs(1))",
                known
                    .iter()
                    .map(|o| match &o.value {
                        Some(v) => format!("{}={v}", o.name),
                        None => o.name.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        argv.push(format!("--{}", o.long).into());
        match (&o.value, value) {
            (Some(_), Some(v)) => {
                if o.long == "mode" {
                    mode = Some(v.to_string());
                }
                argv.push(v.into());
            }
            (Some(v), None) => {
                return Err(format!("mount option '{name}' needs a value: {name}={v}"));
            }
            (None, Some(_)) => {
                return Err(format!("mount option '{name}' takes no value: '{opt}'"));
            }
            (None, None) => {}
        }
    }
    if ro {
        match mode.as_deref() {
            None => argv.extend(["--mode".into(), "read-only".into()]),
            Some("read-only") => {}
            Some(m) => return Err(format!("mount options 'ro' and 'mode={m}' contradict")),
        }
    }
    // `--` so that a SOURCE or MOUNTPOINT starting with '-' is never read as a flag.
    argv.push("--".into());
    argv.push(source.clone());
    argv.push(mountpoint.clone());
    Ok(argv)
}

fn utf8(s: &OsStr) -> Result<String, String> {
    s.to_str()
        .map(str::to_string)
        .ok_or_else(|| format!("-o options must be UTF-8: {}", s.to_string_lossy()))
}

/// Makes the paths in `m` absolute against `cwd`: the daemonized mount runs from `/`.
pub fn absolutize(m: &mut MountArgs, cwd: &Path) {
    let abs = |p: &PathBuf| {
        if p.is_absolute() {
            p.clone()
        } else {
            cwd.join(p)
        }
    };
    m.source = abs(&m.source);
    m.mountpoint = abs(&m.mountpoint);
    m.policy = m.policy.iter().map(abs).collect();
    m.stage = m.stage.as_ref().map(abs);
    m.checkpoint_socket = m.checkpoint_socket.as_ref().map(abs);
    m.answers = m.answers.as_ref().map(abs);
    if let Some(a) = m.audit.as_mut().filter(|a| *a != "-")
        && !Path::new(a.as_str()).is_absolute()
    {
        *a = cwd.join(a.as_str()).to_string_lossy().into_owned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Mode;
    use clap::Parser;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn parse_opts(o: &str) -> Result<MountArgs, String> {
        parse(&os(&["/srv/work", "/run/fencefs/work", "-o", o]))
    }

    #[test]
    fn the_issue_example_and_what_mount_fuse3_adds() {
        let m = parse_opts(
            "policy=/etc/fencefs/work.toml,mode=workspace-write,allow_other,\
             audit=/var/log/fencefs/work.jsonl,rw,dev,suid",
        )
        .unwrap();
        assert_eq!(m.source, PathBuf::from("/srv/work"));
        assert_eq!(m.mountpoint, PathBuf::from("/run/fencefs/work"));
        assert_eq!(m.policy, vec![PathBuf::from("/etc/fencefs/work.toml")]);
        assert_eq!(m.mode, Some(Mode::WorkspaceWrite));
        assert!(m.allow_other);
        assert_eq!(m.audit.as_deref(), Some("/var/log/fencefs/work.jsonl"));
        assert!(!m.audit_allowed && !m.revoke && !m.no_watch && !m.daemonized);
        assert_eq!(m.ready_fd, None);
        // clap's defaults apply exactly as for `fencefs mount`.
        assert_eq!((m.audit_max_size, m.audit_keep), (64 << 20, 4));
    }

    #[test]
    fn same_values_as_fencefs_mount() {
        let o = parse_opts(
            "policy=p.toml,audit=a.jsonl,audit_allowed,audit_max_size=64K,audit_keep=2,\
             threads=3,revoke,no_confine,no_passthrough,cache_ttl=0.5,no_watch,\
             map_uid=1000:1001,map_uid=2000:1002,map_gid=1000:1001,max_open_per_uid=500",
        )
        .unwrap();
        let cli = Cli::try_parse_from([
            "fencefs",
            "mount",
            "--policy",
            "p.toml",
            "--audit",
            "a.jsonl",
            "--audit-allowed",
            "--audit-max-size",
            "64K",
            "--audit-keep",
            "2",
            "--threads",
            "3",
            "--revoke",
            "--no-confine",
            "--no-passthrough",
            "--cache-ttl",
            "0.5",
            "--no-watch",
            "--map-uid",
            "1000:1001",
            "--map-uid",
            "2000:1002",
            "--map-gid",
            "1000:1001",
            "--max-open-per-uid",
            "500",
            "/srv/work",
            "/run/fencefs/work",
        ])
        .unwrap();
        let Command::Mount(c) = cli.command else {
            unreachable!()
        };
        assert_eq!(format!("{o:?}"), format!("{c:?}"));
        assert_eq!(o.map_uid, vec!["1000:1001", "2000:1002"]);
        assert_eq!(
            (o.audit_max_size, o.audit_keep, o.threads),
            (65_536, 2, Some(3))
        );
        assert_eq!(o.cache_ttl, Some(0.5));
    }

    #[test]
    fn generic_and_userspace_options_are_accepted() {
        let m = parse_opts(
            "defaults,rw,dev,suid,nodev,nosuid,exec,async,auto,noauto,nofail,_netdev,user,\
             users,nouser,x-systemd.automount,x-systemd.requires=network-online.target,\
             x-mount.mkdir=0755,comment=systemd.foo,,policy=/p",
        )
        .unwrap();
        assert_eq!(m.policy, vec![PathBuf::from("/p")]);
        assert_eq!(m.mode, None);
        assert!(!m.allow_other);
    }

    #[test]
    fn unknown_options_are_errors_naming_them() {
        let e = parse_opts("policy=/p,bogus,allow_other").unwrap_err();
        assert!(
            e.starts_with("unknown mount option 'bogus'; fencefs options: policy=FILE, "),
            "{e}"
        );
        assert!(
            e.contains(", allow_other, ") && e.ends_with("see fencefs(1))"),
            "{e}"
        );
        let e = parse_opts("noexec").unwrap_err();
        assert!(e.starts_with("unknown mount option 'noexec';"), "{e}");
        let e = parse_opts("allow-other").unwrap_err();
        assert!(
            e.starts_with("unknown mount option 'allow-other' (did you mean 'allow_other'?)"),
            "{e}"
        );
        // mount.fuse3 consumes these; fencefs never sees them from mount(8).
        for o in [
            "drop_privileges",
            "setuid=nobody",
            "ready_fd=3",
            "help",
            "version",
        ] {
            let e = parse_opts(o).unwrap_err();
            let name = o.split('=').next().unwrap();
            assert!(
                e.starts_with(&format!("unknown mount option '{name}'")),
                "{o}: {e}"
            );
        }
    }

    #[test]
    fn values_are_checked() {
        assert_eq!(
            parse_opts("policy").unwrap_err(),
            "mount option 'policy' needs a value: policy=FILE"
        );
        assert_eq!(
            parse_opts("allow_other=1").unwrap_err(),
            "mount option 'allow_other' takes no value: 'allow_other=1'"
        );
        assert_eq!(
            parse_opts("rw=1").unwrap_err(),
            "mount option 'rw' takes no value: 'rw=1'"
        );
        let e = parse_opts("mode=bogus").unwrap_err();
        assert!(
            e.starts_with("-o options: invalid value 'bogus' for 'mode=MODE'"),
            "{e}"
        );
        // Two policy files are two layers (SPEC "Policy layers").
        let m = parse_opts("policy=/a,policy=/b").unwrap();
        assert_eq!(m.policy, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(
            parse_opts("audit_keep=2").unwrap_err(),
            "-o options: the following required arguments were not provided: audit=FILE|-"
        );
    }

    #[test]
    fn the_same_option_twice_is_once() {
        let m = parse_opts("allow_other,policy=/p,allow_other,policy=/p,map_uid=1:2,map_uid=1:2")
            .unwrap();
        assert!(m.allow_other);
        assert_eq!(m.policy, vec![PathBuf::from("/p")]);
        assert_eq!(m.map_uid, vec!["1:2"]);
        let m = parse(&os(&[
            "/s",
            "/m",
            "-o",
            "allow_other",
            "-o",
            "allow_other,rw",
        ]))
        .unwrap();
        assert!(m.allow_other);
    }

    #[test]
    fn ro_is_read_only_mode() {
        assert_eq!(parse_opts("ro").unwrap().mode, Some(Mode::ReadOnly));
        assert_eq!(
            parse_opts("ro,mode=read-only").unwrap().mode,
            Some(Mode::ReadOnly)
        );
        assert_eq!(
            parse_opts("mode=danger,ro").unwrap_err(),
            "mount options 'ro' and 'mode=danger' contradict"
        );
    }

    #[test]
    fn argument_shapes() {
        let m = parse(&os(&["src", "mnt", "-opolicy=/p", "-o", "allow_other"])).unwrap();
        assert_eq!(m.policy, vec![PathBuf::from("/p")]);
        assert!(m.allow_other);
        let m = parse(&os(&["src", "mnt"])).unwrap();
        assert_eq!((m.source, m.mountpoint), ("src".into(), "mnt".into()));
        // A SOURCE that looks like a flag after the first is still a path.
        let argv = to_mount_argv(&os(&["/s", "/m", "-o", "rw"])).unwrap();
        assert_eq!(argv, os(&["fencefs", "mount", "--", "/s", "/m"]));
        assert_eq!(
            parse(&os(&["src"])).unwrap_err(),
            "expected SOURCE and MOUNTPOINT, got 1 argument(s) \
             (usage: fencefs SOURCE MOUNTPOINT [-o OPTION[,OPTION...]])"
        );
        assert!(
            parse(&os(&["a", "b", "c"]))
                .unwrap_err()
                .starts_with("expected SOURCE")
        );
        assert!(
            parse(&os(&["a", "b", "-v"]))
                .unwrap_err()
                .starts_with("unexpected argument '-v'")
        );
        assert!(
            parse(&os(&["a", "b", "-o"]))
                .unwrap_err()
                .starts_with("-o needs a value")
        );
    }

    #[test]
    fn helper_form_is_told_from_subcommands() {
        let none = |_: &Path| false;
        let all = |_: &Path| true;
        let h = |v: &[&str], e: &dyn Fn(&Path) -> bool| is_helper_form(&os(v), e);
        assert!(h(&["fencefs", "/srv/w", "/mnt", "-o", "rw"], &none));
        assert!(h(&["fencefs", "src", "mnt"], &all));
        assert!(
            !h(&["fencefs", "src", "mnt"], &none),
            "a typo stays a clap error"
        );
        for sub in ["mount", "check", "explain", "help", "generate-docs"] {
            assert!(!h(&["fencefs", sub, "/a", "/b"], &all), "{sub}");
        }
        assert!(!h(&["fencefs", "--version"], &all));
        assert!(!h(&["fencefs", "-h", "/a"], &all));
        assert!(!h(&["fencefs", "/a"], &all));
    }

    #[test]
    fn every_mount_flag_is_an_o_option() {
        let names: Vec<String> = options().into_iter().map(|o| o.name).collect();
        for want in [
            "policy",
            "mode",
            "audit",
            "audit_allowed",
            "audit_max_size",
            "audit_keep",
            "allow_other",
            "threads",
            "revoke",
            "no_confine",
            "no_passthrough",
            "cache_ttl",
            "no_watch",
            "no_xattr",
            "map_uid",
            "map_gid",
            "max_open_per_uid",
            "ask_dir_hold",
            "answers",
            "ask_exec",
            "root",
            "no_git_worktree",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        assert!(!names.iter().any(|n| n == "ready_fd" || n == "help"));
    }

    #[test]
    fn relative_paths_become_absolute() {
        let mut m = parse(&os(&["src", "/mnt", "-o", "policy=p.toml,audit=a.jsonl"])).unwrap();
        absolutize(&mut m, Path::new("/home/u"));
        assert_eq!(m.source, PathBuf::from("/home/u/src"));
        assert_eq!(m.mountpoint, PathBuf::from("/mnt"));
        assert_eq!(m.policy, vec![PathBuf::from("/home/u/p.toml")]);
        assert_eq!(m.audit.as_deref(), Some("/home/u/a.jsonl"));
        let mut m = parse(&os(&["/s", "/m", "-o", "audit=-"])).unwrap();
        absolutize(&mut m, Path::new("/home/u"));
        assert_eq!(m.audit.as_deref(), Some("-"));
    }

    #[test]
    fn stage_dir_as_a_mount_option_made_absolute() {
        let mut m = parse(&os(&["/s", "/m", "-o", "stage=st,mode=workspace-write"])).unwrap();
        assert_eq!(m.stage, Some(PathBuf::from("st")));
        absolutize(&mut m, Path::new("/home/u"));
        assert_eq!(m.stage, Some(PathBuf::from("/home/u/st")));
    }
}
