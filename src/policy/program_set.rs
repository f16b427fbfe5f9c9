//! What a policy set's program rules (`exe`, `ancestor_exe`: `programs.rs`) ask of the
//! glue: whether to resolve the calling program at all, and its ancestors; which rules a
//! resolved program matches (the bit set for [`Caller::progs`](super::Caller)); and the
//! set's cap, [`MAX_PROGRAM_RULES`]. PURE.
//!
//! Invariants: answers depend on the layers' compiled selectors only (their bits given
//! in layer order when the set is made, `programs::assign_bits`); a set over the cap is
//! refused with an error naming its last file, never trimmed.

use super::programs::MAX_PROGRAM_RULES;
use super::{Policy, PolicyError};

impl Policy {
    /// Whether some layer has a rule with `exe` or `ancestor_exe`: answers then depend on
    /// the calling program, and the glue must resolve it per request.
    pub fn has_programs(&self) -> bool {
        self.layers()
            .iter()
            .any(|l| l.prog.iter().any(Option::is_some))
    }

    /// The program rules a process running `exe` with `ancestors` (parent first) matches,
    /// as the bit set for [`Caller::progs`](super::Caller).
    pub fn match_programs(&self, exe: &[u8], ancestors: &[Vec<u8>]) -> u64 {
        let mut bits = 0u64;
        for l in self.layers() {
            for sel in l.prog.iter().flatten() {
                if let Some(bit) = sel.bit
                    && sel.matches(exe, ancestors)
                {
                    bits |= 1 << bit;
                }
            }
        }
        bits
    }

    /// Whether any rule with `ancestor_exe` exists (the glue walks ancestors only then).
    pub fn has_ancestor_programs(&self) -> bool {
        self.layers()
            .iter()
            .any(|l| l.prog.iter().flatten().any(|s| s.ancestor.is_some()))
    }

    /// The set's limits: at most [`MAX_PROGRAM_RULES`] program rules.
    pub fn check_limits(&self) -> Result<(), Vec<PolicyError>> {
        let n: usize = self
            .layers()
            .iter()
            .map(|l| l.prog.iter().flatten().count())
            .sum();
        if n <= MAX_PROGRAM_RULES {
            return Ok(());
        }
        Err(vec![PolicyError {
            file: self
                .layers()
                .last()
                .map(|l| l.file().to_string())
                .unwrap_or_default(),
            line: 0,
            column: 0,
            message: format!(
                "{n} rules with exe/ancestor_exe in the policy set: at most {MAX_PROGRAM_RULES}"
            ),
        }])
    }
}
