//! The policy file's JSON Schema (`fencefs schema`, generated with schemars from the serde
//! types in src/policy/schema.rs): a real JSON Schema validator (the `jsonschema` crate,
//! as editors use one) accepts every policy the parser accepts — policy.example.toml, the
//! deployed and conformance policies, the fuzz seeds, the book's examples, the presets —
//! and rejects a misspelled key, as the parser and serde do; its keys are the parser's.

#[path = "common/mod.rs"]
mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn schema() -> serde_json::Value {
    let out = run_fencefs(["schema"], Duration::from_secs(30));
    assert!(out.ok(), "fencefs schema: {}", out.stderr);
    assert_eq!(out.stdout, fencefs::policy::schema::json());
    serde_json::from_str(&out.stdout).expect("the schema is JSON")
}

fn validator() -> jsonschema::Validator {
    let s = schema();
    assert_eq!(s["$schema"], "http://json-schema.org/draft-07/schema#");
    jsonschema::draft7::new(&s).expect("the schema compiles as draft-07")
}

/// Whether the schema, the parser and serde accept `text`.
fn verdicts(v: &jsonschema::Validator, text: &str) -> (bool, bool, bool) {
    let json: serde_json::Value = toml::from_str(text).expect("TOML");
    let schema_ok = v.is_valid(&json);
    let parser_ok = fencefs::policy::Policy::parse(text, "t.toml").is_ok();
    let serde_ok = toml::from_str::<fencefs::policy::schema::PolicyFile>(text).is_ok();
    (schema_ok, parser_ok, serde_ok)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every policy file in the repository, and the book's ```toml examples.
fn corpus() -> Vec<(String, String)> {
    let mut out = vec![];
    let mut add = |p: &Path| {
        let text = fs::read_to_string(p).unwrap();
        out.push((p.display().to_string(), text));
    };
    add(&root().join("policy.example.toml"));
    add(&root().join("deploy/policy/policy.toml"));
    for dir in ["conformance", "fuzz/seeds/policy"] {
        let mut files: Vec<PathBuf> = fs::read_dir(root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        files.sort();
        files.iter().for_each(|p| add(p));
    }
    for md in ["policy.md", "approvals.md"] {
        let text = fs::read_to_string(root().join("docs/src").join(md)).unwrap();
        for (k, block) in text.split("```toml\n").skip(1).enumerate() {
            let body = block.split("```").next().unwrap_or_default();
            out.push((format!("docs/src/{md} example {}", k + 1), body.to_string()));
        }
    }
    let presets = run_fencefs(["presets"], Duration::from_secs(30));
    out.push(("fencefs presets".into(), presets.stdout));
    out
}

#[test]
fn the_schema_accepts_every_policy_the_parser_accepts() {
    let v = validator();
    let mut accepted = 0;
    for (name, text) in corpus() {
        let (schema_ok, parser_ok, serde_ok) = verdicts(&v, &text);
        if parser_ok {
            accepted += 1;
            let json: serde_json::Value = toml::from_str(&text).unwrap();
            let errors: Vec<String> = v.iter_errors(&json).map(|e| e.to_string()).collect();
            assert!(
                schema_ok,
                "{name}: the parser accepts it, the schema does not: {errors:?}"
            );
            assert!(
                serde_ok,
                "{name}: the parser accepts it, the serde types do not"
            );
        }
    }
    assert!(accepted >= 10, "only {accepted} policies checked");
    // policy.example.toml uses the newer keys: the schema knows them.
    let example = fs::read_to_string(root().join("policy.example.toml")).unwrap();
    assert!(verdicts(&v, &example).0);
}

#[test]
fn the_schema_rejects_misspelled_keys_and_bad_words_like_the_parser() {
    let v = validator();
    let base = "mode = \"danger\"\n[[rule]]\npath = \"a\"\naccess = \"read\"\n";
    assert_eq!(verdicts(&v, base), (true, true, true));
    // A misspelled key: the schema, the parser and serde (deny_unknown_fields) refuse it.
    let keys = [
        "mdoe = \"danger\"\n",
        "ignore_file = [\".aiignore\"]\n",
        "workspace_polcy = \".fencefs.toml\"\n",
        "[[rule]]\npath = \"a\"\naccess = \"read\"\nexcept_ = []\n",
        "[[rules]]\npath = \"a\"\naccess = \"read\"\n",
    ];
    for text in keys {
        assert_eq!(verdicts(&v, text), (false, false, false), "{text}");
    }
    // A bad value: the schema refuses what the parser refuses (serde checks only shapes).
    let values = [
        "mode = \"dangerous\"\n",
        "[[rule]]\npath = \"a\"\naccess = \"rw\"\n",
        "[[rule]]\naccess = \"read\"\n",
        "presets = [\"secret\"]\n",
        "[[rule]]\npath = \"a\"\naccess = \"read\"\nuid = []\n",
        "[[rule]]\npath = \"a\"\naccess = \"read\"\nuid = [-1]\n",
        "allow_setid = \"yes\"\n",
    ];
    for text in values {
        let (schema_ok, parser_ok, _) = verdicts(&v, text);
        assert_eq!((schema_ok, parser_ok), (false, false), "{text}");
    }
}

#[test]
fn the_schema_has_exactly_the_parsers_keys() {
    let s = schema();
    let keys = |o: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = o["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .cloned()
            .collect();
        k.sort();
        k
    };
    let (top, rule) = fencefs::policy::schema::parser_keys();
    let sorted = |v: Vec<&str>| {
        let mut v: Vec<String> = v.into_iter().map(String::from).collect();
        v.sort();
        v
    };
    assert_eq!(
        keys(&s),
        sorted(top),
        "top-level keys: update src/policy/schema.rs"
    );
    assert_eq!(
        keys(&s["definitions"]["Rule"]),
        sorted(rule),
        "[[rule]] keys"
    );
    assert_eq!(s["additionalProperties"], false);
    assert_eq!(s["definitions"]["Rule"]["additionalProperties"], false);
}
