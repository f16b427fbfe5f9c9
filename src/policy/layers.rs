//! Policy layers: the compiled [`Policy`] is a set of [`Layer`]s (one per `--policy` file,
//! in order), and every question the rest of the crate asks is answered here for the set.
//! PURE (`&self` only; reading the files in [`Policy::load_all`] is the only I/O).
//!
//! # Combination (SPEC "Policy layers, presets and ignore files")
//!
//! Every layer decides a request on its own. The request is refused if any layer refuses;
//! when several refuse, the errno follows the contract's order across layers (`none` →
//! ENOENT (EACCES for a create), device/setid → EPERM, the mode → EROFS, a rule → EACCES).
//! Among rule refusals one that no approver can lift wins over one an `ask` could lift, so
//! a request is held only when every refusing layer would hold it. A path's access is the
//! lowest of the layers' (the first such layer decides among equals). The mode is the most
//! restrictive of the modes the layers set (a layer without a `mode` key does not take
//! part; none sets one → read-only), and `--mode` overrides it for every layer; each layer
//! applies that mode with its own `writable_roots` and `protected`.
//!
//! Invariants: a layer can only tighten (adding a layer never turns a refusal into an
//! allow, nor raises an access); with one layer every answer is that layer's, unchanged;
//! rule and `protected` indices in [`By`]/[`CeilingBy`] are global (layer offsets added),
//! so [`Policy::rule`] and [`Policy::protected_entry`] take what the decisions produce;
//! the set is built whole or not at all (one broken layer fails the load).

use std::path::Path;
use std::sync::Arc;

use super::Special;
use super::build::Layer;
use super::ignore::{IgnoreSet, IgnoreSource};
use super::{Access, By, Caller, CeilingBy, Denial, Mode, Need, PolicyError, Refusal, RuleInfo};
use super::{Verdict, load_layer};

/// The compiled set of layers. Cheap to query from many threads (`&self` only).
#[derive(Debug, Clone)]
pub struct Policy {
    layers: Vec<Layer>,
    /// Parallel to `layers`: the global index of the layer's first rule.
    rule_off: Vec<usize>,
    /// Parallel to `layers`: the global index of the layer's first `protected` entry.
    prot_off: Vec<usize>,
    /// Every layer's rules, in layer order, each with its `layer` set.
    rules: Vec<RuleInfo>,
    /// Every layer's `protected` entries, in layer order ([`CeilingBy::Protected`] indices).
    protected: Vec<String>,
    mode: Mode,
    has_id_rules: bool,
    may_hide: bool,
    /// Whether some rule has an `ask` (else no refusal can be put to an approver).
    has_asks: bool,
    /// Paths read-only to every caller in every mode (EROFS): the workspace layer's file.
    pinned: Vec<Vec<u8>>,
    /// Every layer's `ignore_files`, compiled with the files found (see `ignore.rs`):
    /// what they match is `none`; the ignore files themselves are pinned like `pinned`.
    ignore: Arc<IgnoreSet>,
}

/// How a refusal ranks (lower decides): its kind in the contract's order ([`Refusal`]),
/// and among rules one that no approver can lift before one an `ask` could lift.
fn rank(layer: &Layer, d: &Denial, need: Need) -> (Refusal, bool) {
    (d.refusal, d.ask_of(need, |i| layer.rule(i).ask).is_some())
}

fn shift_by(by: By, off: usize) -> By {
    match by {
        By::Rule(i) => By::Rule(i + off),
        By::Visibility(i) => By::Visibility(i + off),
        other => other,
    }
}

impl Policy {
    /// The set of `layers`, in order (at least one). The combined mode is applied to
    /// every layer (see the module header).
    pub fn from_layers(mut layers: Vec<Layer>) -> Policy {
        if layers.is_empty() {
            layers.push(Layer::builtin_default());
        }
        let mode = layers
            .iter()
            .filter(|l| l.mode_set)
            .map(|l| l.mode())
            .min_by_key(|m| mode_rank(*m))
            .unwrap_or(Mode::ReadOnly);
        let (mut rule_off, mut prot_off, mut rules) = (Vec::new(), Vec::new(), Vec::new());
        let mut protected = Vec::new();
        super::programs::assign_bits(layers.iter_mut().map(|l| &mut l.prog));
        for (k, l) in layers.iter_mut().enumerate() {
            l.set_mode(mode);
            rule_off.push(rules.len());
            prot_off.push(protected.len());
            protected.extend(l.protected().iter().cloned());
            rules.extend(l.rules().iter().cloned().map(|mut r| {
                r.layer = k;
                r
            }));
        }
        let pinned = layers
            .iter()
            .filter_map(|l| l.workspace_policy())
            .map(|n| n.as_bytes().to_vec())
            .collect();
        let mut names: Vec<String> = Vec::new();
        for n in layers.iter().flat_map(|l| l.ignore_files()) {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        let ignore = Arc::new(IgnoreSet::compile(&names, &[]).unwrap_or_default());
        Policy {
            pinned,
            may_hide: layers.iter().any(Layer::may_hide) || !names.is_empty(),
            ignore,
            has_id_rules: layers.iter().any(Layer::has_id_rules),
            has_asks: rules.iter().any(|r| r.ask.is_some()),
            layers,
            rule_off,
            prot_off,
            rules,
            protected,
            mode,
        }
    }

    /// Reads and compiles one policy file as a set of one layer.
    pub fn load(path: &Path) -> Result<Policy, Vec<PolicyError>> {
        let p = Policy::from_layers(vec![load_layer(path)?]);
        p.check_limits()?;
        Ok(p)
    }

    /// Parses policy text as a set of one layer (`file` names it in errors).
    pub fn parse(src: &str, file: &str) -> Result<Policy, Vec<PolicyError>> {
        let p = Policy::from_layers(vec![Layer::parse(src, file)?]);
        p.check_limits()?;
        Ok(p)
    }

    /// Reads and compiles every file, in order: the set, or the errors of every file that
    /// fails (each error names its file).
    pub fn load_all(paths: &[impl AsRef<Path>]) -> Result<Policy, Vec<PolicyError>> {
        let mut layers = Vec::with_capacity(paths.len());
        let mut errors = Vec::new();
        for p in paths {
            match load_layer(p.as_ref()) {
                Ok(l) => layers.push(l),
                Err(e) => errors.extend(e),
            }
        }
        if errors.is_empty() {
            let p = Policy::from_layers(layers);
            p.check_limits()?;
            Ok(p)
        } else {
            Err(errors)
        }
    }

    /// The policy used without `--policy` (one layer: see [`Layer::builtin_default`]).
    pub fn builtin_default() -> Policy {
        Policy::from_layers(vec![Layer::builtin_default()])
    }

    /// The workspace layer's file name (`workspace_policy`, the first layer that sets it).
    pub fn workspace_policy(&self) -> Option<&str> {
        self.layers.iter().find_map(|l| l.workspace_policy())
    }

    /// Whether `path` is read-only to every caller in every mode (the workspace layer's
    /// file, and any file named in `ignore_files`, wherever it stands, whether it exists
    /// or not: creating it is refused too).
    pub fn pinned(&self, path: &[u8]) -> bool {
        self.pinned.iter().any(|p| p == path) || self.ignore.is_ignore_file(path)
    }

    /// The names of the ignore files (every layer's `ignore_files`, first mention order).
    pub fn ignore_names(&self) -> &[String] {
        self.ignore.names()
    }

    /// The compiled ignore files.
    pub fn ignore_set(&self) -> &IgnoreSet {
        &self.ignore
    }

    /// The set with the ignore files found in SOURCE (`sources`, read by the host side)
    /// compiled in; an unparsable line fails it (each error names file and line).
    pub fn with_ignores(mut self, sources: &[IgnoreSource]) -> Result<Policy, Vec<PolicyError>> {
        self.ignore = Arc::new(IgnoreSet::compile(self.ignore.names(), sources)?);
        Ok(self)
    }

    /// The ignore files compiled in, as read (see [`IgnoreSet::sources`]).
    pub fn ignore_sources(&self) -> Vec<IgnoreSource> {
        self.ignore.sources()
    }

    /// The verdict for a path an ignore file hides, if `path` is one.
    fn ignored(&self, path: &[u8], is_dir: bool) -> Option<Verdict> {
        let hit = self.ignore.hides(path, is_dir)?;
        let name = self.ignore.describe_name(hit);
        let layer = self
            .layers
            .iter()
            .position(|l| l.ignore_files().iter().any(|n| n.as_bytes() == name))
            .unwrap_or(0);
        Some(Verdict {
            grant: Access::None,
            effective: Access::None,
            by: By::Ignore(hit),
            grant_by: By::Ignore(hit),
            layer,
        })
    }

    /// The set plus `extra` as one more, last layer (the workspace layer): the mode is
    /// recombined; the pins stay those of `self`'s layers.
    pub fn with_layer(self, extra: Layer) -> Policy {
        let pinned = self.pinned.clone();
        debug_assert!(self.ignore.is_empty(), "ignore files are compiled in last");
        let mut layers = self.layers;
        layers.push(extra);
        let mut p = Policy::from_layers(layers);
        p.pinned = pinned;
        p
    }

    /// The layers, in order; [`RuleInfo::layer`] and [`Verdict::layer`] index into this.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The file layer `k` was read from, as given.
    pub fn layer_file(&self, k: usize) -> &str {
        self.layers[k].file()
    }

    /// The file of layer `k` for audit lines: `None` for the built-in policy.
    pub fn layer_name(&self, k: usize) -> Option<&str> {
        let l = self.layers.get(k)?;
        l.from_file().then(|| l.file())
    }

    /// Overrides the mode of every layer (the CLI's `--mode`).
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
        for l in &mut self.layers {
            l.set_mode(mode);
        }
    }

    /// The mode in force.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The access of paths no rule of any layer matches: the meet of the layer defaults.
    pub fn default_access(&self) -> Access {
        self.layers
            .iter()
            .map(Layer::default_access)
            .reduce(Access::meet)
            .unwrap_or(Access::None)
    }

    /// Every layer's rules, in layer order; [`By::Rule`] and [`By::Visibility`] index into this.
    pub fn rules(&self) -> &[RuleInfo] {
        &self.rules
    }

    /// Whether some rule has an `ask`: without one no refusal is askable
    /// ([`Denial::askable`] is `None`), so nothing is put to an approver.
    pub fn has_asks(&self) -> bool {
        self.has_asks
    }

    /// Rule `idx` (as found in [`By::Rule`] / [`By::Visibility`]). Panics when out of range.
    pub fn rule(&self, idx: usize) -> &RuleInfo {
        &self.rules[idx]
    }

    /// Every layer's `protected` entries as written, in layer order.
    pub fn protected(&self) -> &[String] {
        &self.protected
    }

    /// Whether files at `path` cannot be executed by `caller` (some layer's `exec = false`
    /// rule covers it; see [`Layer::exec_denied`]): the global index of that rule.
    pub fn exec_denied(&self, path: &[u8], caller: Caller) -> Option<usize> {
        self.layers
            .iter()
            .enumerate()
            .find_map(|(k, l)| l.exec_denied(path, caller).map(|i| i + self.rule_off[k]))
    }

    /// Some layer has an `exec = false` rule.
    pub fn has_noexec(&self) -> bool {
        self.layers.iter().any(|l| !l.noexec_rules.is_empty())
    }

    /// Some layer has a rule with a `uid` or `gid` list.
    pub fn has_id_rules(&self) -> bool {
        self.has_id_rules
    }

    /// Some layer could hide some path from some caller (see [`Layer::may_hide`]).
    pub fn may_hide(&self) -> bool {
        self.may_hide
    }

    /// Every layer says `allow_setid = true`.
    pub fn allow_setid(&self) -> bool {
        self.layers.iter().all(Layer::allow_setid)
    }

    /// The virtual `.fencefs/` directory is shown: some layer says `agent_notes = true`
    /// and none says `false` (a layer can turn the notes off, as it can only tighten).
    pub fn agent_notes(&self) -> bool {
        let set = || self.layers.iter().filter_map(Layer::agent_notes);
        set().any(|b| b) && set().all(|b| b)
    }

    /// Every layer says `allow_devices = true`.
    pub fn allow_devices(&self) -> bool {
        self.layers.iter().all(Layer::allow_devices)
    }

    /// Whether rule `idx` (global) applies to `caller`. Panics when out of range.
    pub fn rule_applies(&self, idx: usize, caller: Caller) -> bool {
        let k = self.rules[idx].layer;
        self.layers[k].rule_applies(idx - self.rule_off[k], caller)
    }

    /// `protected` entry `idx` (global, as in [`CeilingBy::Protected`]) as written, with
    /// its line in its layer's file (`None` for the built-in default list), and the layer.
    pub fn protected_entry(&self, idx: usize) -> (&str, Option<usize>) {
        let k = self.prot_layer(idx);
        self.layers[k].protected_entry(idx - self.prot_off[k])
    }

    /// The layer `protected` entry `idx` (global) comes from.
    pub fn prot_layer(&self, idx: usize) -> usize {
        self.prot_off
            .partition_point(|&o| o <= idx)
            .saturating_sub(1)
    }

    fn shift(&self, k: usize, v: Verdict) -> Verdict {
        let off = self.rule_off[k];
        Verdict {
            by: shift_by(v.by, off),
            grant_by: shift_by(v.grant_by, off),
            layer: k,
            ..v
        }
    }

    fn shift_denial(&self, k: usize, d: Denial) -> Denial {
        Denial {
            verdict: self.shift(k, d.verdict),
            by: shift_by(d.by, self.rule_off[k]),
            ..d
        }
    }

    /// The layer whose ceiling is lowest at `path` (the first among equals).
    fn ceiling_layer(&self, path: &[u8]) -> usize {
        (0..self.layers.len())
            .find(|&k| self.layers[k].ceiling_by(path) != CeilingBy::Open)
            .unwrap_or(0)
    }

    /// What sets the mode's ceiling at `path`: the first layer whose ceiling is not open.
    pub fn ceiling_by(&self, path: &[u8]) -> CeilingBy {
        let k = self.ceiling_layer(path);
        match self.layers[k].ceiling_by(path) {
            CeilingBy::Protected(i) => CeilingBy::Protected(i + self.prot_off[k]),
            other => other,
        }
    }

    /// The layer [`Policy::ceiling_by`] names at `path`.
    pub fn ceiling_layer_at(&self, path: &[u8]) -> usize {
        self.ceiling_layer(path)
    }

    /// Why the mode caps `path` at `read` (for `explain` and logs).
    pub fn ceiling_reason(&self, path: &[u8]) -> &'static str {
        self.layers[self.ceiling_layer(path)].ceiling_reason(path)
    }

    /// The mode's ceiling at `path`: the lowest layer's.
    pub fn ceiling(&self, path: &[u8]) -> Access {
        self.layers
            .iter()
            .map(|l| l.ceiling(path))
            .reduce(Access::meet)
            .unwrap_or(Access::Read)
    }

    /// Every layer's rules that an `except` glob takes out at `path` (global indices).
    pub fn excepted(&self, path: &[u8], caller: Caller) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (k, l) in self.layers.iter().enumerate() {
            let off = self.rule_off[k];
            out.extend(
                l.excepted(path, caller)
                    .into_iter()
                    .map(|(r, e)| (r + off, e)),
            );
        }
        out
    }

    /// Each layer's verdict at `path` (global indices), in layer order.
    pub fn layer_verdicts(&self, path: &[u8], caller: Caller, is_dir: bool) -> Vec<Verdict> {
        (0..self.layers.len())
            .map(|k| self.shift(k, self.layers[k].verdict_for(path, caller, is_dir)))
            .collect()
    }

    /// Each layer's answer to one request (global indices), in layer order.
    pub fn layer_checks(
        &self,
        path: &[u8],
        caller: Caller,
        need: Need,
        special: Special,
        is_dir: bool,
    ) -> Vec<Result<Verdict, Denial>> {
        (0..self.layers.len())
            .map(|k| {
                self.layers[k]
                    .check_for(path, caller, need, special, is_dir)
                    .map(|v| self.shift(k, v))
                    .map_err(|d| self.shift_denial(k, d))
            })
            .collect()
    }

    /// The access `path` gets for `caller` (visibility lift as for a directory).
    pub fn verdict(&self, path: &[u8], caller: Caller) -> Verdict {
        self.verdict_for(path, caller, true)
    }

    /// The access `path` gets for `caller`: the lowest of the layers' (the first such
    /// layer decides), knowing whether `path` is a directory (see [`Layer::verdict_for`]).
    pub fn verdict_for(&self, path: &[u8], caller: Caller, is_dir: bool) -> Verdict {
        if let Some(v) = self.ignored(path, is_dir) {
            return v;
        }
        let v = self.verdict_layers(path, caller, is_dir);
        if v.effective.mutates() && self.pinned(path) {
            return Verdict {
                effective: Access::Read,
                by: By::Mode,
                ..v
            };
        }
        v
    }

    fn verdict_layers(&self, path: &[u8], caller: Caller, is_dir: bool) -> Verdict {
        let vs: Vec<(usize, Verdict)> = self
            .layers
            .iter()
            .enumerate()
            .map(|(k, l)| (k, l.verdict_for(path, caller, is_dir)))
            .collect();
        // There is always a layer (`from_layers`); layer 0's verdict stands in otherwise.
        self.lowest(vs)
            .unwrap_or_else(|| self.layers[0].verdict_for(path, caller, is_dir))
    }

    /// The verdict of several layers that all allow: the meet of their effective access
    /// (`create` in one layer and `append` in another give `read`), decided by the first
    /// layer with exactly that access, or — when the meet is no layer's own — by the first
    /// layer of the lowest rank.
    fn lowest(&self, vs: Vec<(usize, Verdict)>) -> Option<Verdict> {
        let meet = vs
            .iter()
            .map(|(_, v)| v.effective)
            .reduce(Access::meet)
            .unwrap_or(Access::None);
        let (k, mut v) = vs
            .iter()
            .copied()
            .find(|(_, v)| v.effective == meet)
            .or_else(|| vs.iter().copied().min_by_key(|(_, v)| v.effective.rank()))?;
        v.effective = meet;
        Some(self.shift(k, v))
    }

    /// Decides one request (visibility lift as for a directory); see [`Policy::check_for`].
    pub fn check(
        &self,
        path: &[u8],
        caller: Caller,
        need: Need,
        special: Special,
    ) -> Result<Verdict, Denial> {
        self.check_for(path, caller, need, special, true)
    }

    /// Decides one request on one path: every layer decides it (see [`Layer::check_for`]);
    /// refused if any refuses, the refusal ranked as the module header says; allowed with
    /// the lowest layer verdict otherwise.
    pub fn check_for(
        &self,
        path: &[u8],
        caller: Caller,
        need: Need,
        special: Special,
        is_dir: bool,
    ) -> Result<Verdict, Denial> {
        if let Some(v) = self.ignored(path, is_dir) {
            return Err(Denial::new(Refusal::Hidden, need, v, v.by));
        }
        let answer = self.check_layers(path, caller, need, special, is_dir);
        if !need.mutates() || !self.pinned(path) {
            return answer;
        }
        // The workspace layer's file: EROFS in every mode, after `none` and device/setid.
        match answer {
            Err(d) if d.refusal < Refusal::Mode => Err(d),
            Err(Denial { verdict, .. }) | Ok(verdict) => Err(Denial::new(
                Refusal::Mode,
                need,
                Verdict {
                    effective: verdict.effective.meet(Access::Read),
                    by: By::Mode,
                    ..verdict
                },
                By::Mode,
            )),
        }
    }

    fn check_layers(
        &self,
        path: &[u8],
        caller: Caller,
        need: Need,
        special: Special,
        is_dir: bool,
    ) -> Result<Verdict, Denial> {
        if self.layers.len() == 1 {
            return self.layers[0].check_for(path, caller, need, special, is_dir);
        }
        let mut ok: Vec<(usize, Verdict)> = Vec::new();
        let mut refused: Option<(usize, (Refusal, bool), Denial)> = None;
        for (k, l) in self.layers.iter().enumerate() {
            match l.check_for(path, caller, need, special, is_dir) {
                Ok(v) => ok.push((k, v)),
                Err(d) => {
                    let r = rank(l, &d, need);
                    if refused.is_none_or(|(_, br, _)| r < br) {
                        refused = Some((k, r, d));
                    }
                }
            }
        }
        if let Some((k, _, d)) = refused {
            return Err(self.shift_denial(k, d));
        }
        match self.lowest(ok) {
            Some(v) => Ok(v),
            // No layer answered: impossible (there is always one), answered as layer 0.
            None => self.layers[0].check_for(path, caller, need, special, is_dir),
        }
    }

    /// Whether renaming a directory from `old` to `new` would move or replace a pinned
    /// file (the workspace layer's, an ignore file): refused with EROFS, not EACCES.
    pub fn dir_rename_pinned(&self, old: &[u8], new: &[u8]) -> bool {
        self.pinned(old)
            || self.pinned(new)
            || self.ignore.holds_ignore_file(old)
            || self.ignore.holds_ignore_file(new)
    }

    /// Whether a directory may be renamed from `old` to `new`: every layer allows it
    /// (see [`Layer::dir_rename_allowed`]).
    pub fn dir_rename_allowed(&self, old: &[u8], new: &[u8]) -> bool {
        // A directory renamed over the pinned name would replace the workspace layer.
        // Nor one holding an ignore file: its patterns would move (or vanish) with it.
        // Nor one whose move would change what an ignore file hides below it.
        !self.dir_rename_pinned(old, new)
            && self.ignore.dir_rename_keeps_hides(old, new)
            && self.layers.iter().all(|l| l.dir_rename_allowed(old, new))
    }
}

/// Modes from most to least restrictive.
fn mode_rank(m: Mode) -> u8 {
    match m {
        Mode::ReadOnly => 0,
        Mode::WorkspaceWrite => 1,
        Mode::Danger => 2,
    }
}
