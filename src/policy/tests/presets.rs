//! Presets: both compile, every rule decides as documented, they never block directory
//! renames, unknown names are errors at their position, `explain` can name the preset.

use super::*;
use crate::policy::presets::PRESETS;

const BOTH: &str = "mode = \"danger\"\npresets = [\"secrets\", \"agent-config\"]\n";

#[test]
fn every_preset_compiles_alone() {
    for p in PRESETS {
        let pol = pol(&format!("presets = [\"{}\"]\n", p.name));
        assert_eq!(pol.rules().len(), p.rules.len(), "{}", p.name);
        assert!(
            pol.rules()
                .iter()
                .all(|r| r.preset == Some(p.name) && r.line == 1)
        );
    }
}

#[test]
fn presets_decide_rule_by_rule() {
    let p = pol(BOTH);
    let rows: &[(&[u8], Access)] = &[
        // secrets
        (b"keys/server.pem", No),
        (b"a/b/tls.key", No),
        (b"home/.ssh/id_ed25519", No),
        (b"id_rsa", No),
        (b"certs/ca.crt", No),
        (
            b"venv/lib/python3.12/site-packages/certifi/cacert.pem",
            Write,
        ),
        (b"web/node_modules/x/test/fixture.pem", Write),
        (b".env", No),
        (b"app/.env.local", No),
        (b".env.example", Write),
        (b".aws/credentials", No),
        (b".ssh", No),
        (b"deploy/.kube/config", No),
        (b".npmrc", No),
        (b"pkg/.pypirc", No),
        (b".netrc", No),
        (b".git-credentials", No),
        (b"ops/prod.kubeconfig", No),
        (b".docker/config.json", No),
        (b"infra/terraform.tfstate", No),
        (b"infra/terraform.tfstate.backup", No),
        // agent-config
        (b".git/hooks/pre-commit", Read),
        (b".git/config", Read),
        (b".git/HEAD", Write),
        (b".claude/settings.json", Read),
        (b"sub/.claude/commands/x.md", Write), // anchored at the root: see presets.rs
        (b".mcp.json", Read),
        (b".cursor/rules", Read),
        (b".gemini/settings.json", Read),
        (b".vscode/tasks.json", Read),
        (b".vscode/settings.json", Read),
        (b".vscode/launch.json", Write),
        (b".husky/pre-commit", Read),
        (b".envrc", Read),
        (b".pre-commit-config.yaml", Read),
        // everything else
        (b"src/main.rs", Write),
    ];
    for &(path, want) in rows {
        let v = p.verdict_for(path, ME, false);
        assert_eq!(v.effective, want, "{}", String::from_utf8_lossy(path));
    }
    // Read-only in danger mode too: a rule, so EACCES, and creating is refused as well.
    let e = p.check(
        b".claude/settings.json",
        ME,
        Need::Write,
        Special::default(),
    );
    assert_eq!(e.unwrap_err().errno, libc::EACCES);
    let e = p.check(b".claude/new.json", ME, Need::Create, Special::default());
    assert_eq!(e.unwrap_err().errno, libc::EACCES);
    let e = p.check(b"keys/new.pem", ME, Need::Create, Special::default());
    assert_eq!(e.unwrap_err().errno, libc::EACCES);
    // The preset that decided is named.
    let v = p.verdict_for(b".npmrc", ME, false);
    let By::Rule(i) = v.by else { panic!("{v:?}") };
    assert_eq!(p.rule(i).preset, Some("secrets"));
}

/// No preset rule lifts a hidden directory to `list` (a floating `read` rule could match
/// below every directory and would; seen with `**/.claude`: `secrets/` and `.ssh/` listable).
#[test]
fn presets_leave_hidden_directories_hidden() {
    let p = pol(&format!(
        "{BOTH}[[rule]]\npath = \"secrets\"\naccess = \"none\"\n"
    ));
    for dir in [&b"secrets"[..], b".ssh", b"home/.aws", b"x/.kube"] {
        let v = p.verdict_for(dir, ME, true);
        assert_eq!(v.effective, No, "{} is {v:?}", String::from_utf8_lossy(dir));
    }
}

#[test]
fn presets_do_not_block_directory_renames() {
    for mode in ["danger", "workspace-write"] {
        let p = pol(&format!(
            "mode = \"{mode}\"\npresets = [\"secrets\", \"agent-config\"]\n"
        ));
        assert!(p.dir_rename_allowed(b"src/a", b"lib/b"), "{mode}");
        assert!(p.dir_rename_allowed(b"a", b"b/c"), "{mode}");
        // Renaming into a package tree would change what its keys get: refused.
        assert!(
            !p.dir_rename_allowed(b"keys", b"node_modules/keys"),
            "{mode}"
        );
    }
}

#[test]
fn unknown_presets_are_errors_at_their_position() {
    let e = Policy::parse("presets = [\"secrets\", \"bogus\"]\n", "t.toml").unwrap_err();
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].line, e[0].column), (1, 23));
    assert!(e[0].message.contains("unknown preset \"bogus\""), "{e:?}");
    let e = Policy::parse("presets = \"secrets\"\n", "t.toml").unwrap_err();
    assert!(e[0].message.contains("array of strings"), "{e:?}");
}

/// `home`, as `fencefs run --home fence` serves $HOME (app/run/setup.rs's layer).
#[test]
fn home_decides_rule_by_rule() {
    let p = pol(
        "mode = \"workspace-write\"\ndefault = \"read\"\nwritable_roots = [\".\"]\n\
         presets = [\"secrets\", \"home\"]\n",
    );
    let rows: &[(&[u8], Access)] = &[
        (b".ssh/id_ed25519", No),
        (b".gnupg/pubring.kbx", No),
        (b".config/gcloud/credentials.db", No),
        (b".config/gh/hosts.yml", No),
        (b".config/google-chrome/Default/Cookies", No),
        (b".docker/config.json", No),
        (b".netrc", No),
        (b".git-credentials", No),
        (b".password-store/x.gpg", No),
        (b".local/share/keyrings/login.keyring", No),
        (b".bash_history", No),
        (b".local/share/fish/fish_history", No),
        (b".local/state/fencefs/0123/stage", No),
        (b".claude.json", Write),
        (b".claude/projects/x.jsonl", Write),
        (b".claude/settings.json", Read),
        (b".claude/hooks/pre.sh", Read),
        (b".codex/sessions/a", Write),
        (b".codex/config.toml", Read),
        (b".gemini/settings.json", Read),
        (b".config/claude/x", Write),
        (b".local/share/opencode/x", Write),
        (b".cache/pip/x", Write),
        (b".npm/_cacache/x", Write),
        (b".cargo/registry/cache/x", Write),
        (b".cargo/bin/cargo", Read),
        (b".cargo/config.toml", Read),
        (b".rustup/toolchains/stable/bin/rustc", Read),
        (b".rustup/downloads/x", Write),
        (b".bashrc", Read),
        (b"projects/other/main.rs", Read),
        (b"projects/other/.env", No),
    ];
    for &(path, want) in rows {
        let v = p.verdict_for(path, ME, false);
        assert_eq!(v.effective, want, "{}", String::from_utf8_lossy(path));
    }
    let v = p.verdict_for(b".bash_history", ME, false);
    let By::Rule(i) = v.by else { panic!("{v:?}") };
    assert_eq!(p.rule(i).preset, Some("home"));
}
