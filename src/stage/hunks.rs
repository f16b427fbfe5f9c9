//! Hunks of a text file's change: the `@@` blocks `stage diff` writes, numbered from 1,
//! and the file made of SOURCE's version with some of them carried over
//! ([`FileDiff::with`]): what `stage apply PATH#N` writes to SOURCE, and (with every
//! hunk but those named) what `stage discard PATH#N` leaves staged.
//!
//! Lines keep their terminators (`\n`, `\r\n`, none on a last line), so a file is always
//! the concatenation of its lines and every result is byte-exact: CRLF files and files
//! without a trailing newline round-trip.
//!
//! The edit script is a longest common subsequence of the lines between the common prefix
//! and suffix when that middle is small (≤ `MAX_CELLS` cells: the same hunks `stage
//! diff` always wrote), else Myers' algorithm (`similar`, linear memory, with a time
//! limit past which it settles for a longer script). Memory, for files of `A` and `B`
//! bytes with `L` lines in all: the two files, 16 bytes a line for the line table, one
//! byte a line for the script, plus at most 16 MiB for the LCS table or 16 bytes a line
//! for Myers; [`FileDiff::with`] builds one more file of at most `A + B` bytes.
//!
//! Invariants: pure; hunk numbers are stable for the same two inputs; hunks never overlap
//! (their changed lines are apart by more than twice [`CONTEXT`]), so any subset can be
//! carried over alone.

use std::io::{self, Write};
use std::time::{Duration, Instant};

/// Lines of context around a change.
pub const CONTEXT: usize = 3;
/// Past this many cells the LCS is not used (Myers instead).
const MAX_CELLS: usize = 4_000_000;
/// How long Myers may search for a shortest script before taking a longer one.
const MYERS_TIME: Duration = Duration::from_secs(5);

/// One step of the edit script.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Op {
    /// A line both have.
    Same,
    /// A line of the old side only.
    Del,
    /// A line of the new side only.
    Ins,
}

/// One hunk: its ops `start..end` (indices into the script), and where it begins on
/// either side (0-based line numbers).
#[derive(Clone, Debug, PartialEq)]
pub struct Hunk {
    start: usize,
    end: usize,
    old_at: usize,
    new_at: usize,
    old_len: usize,
    new_len: usize,
}

/// The change from `a` to `b`, as lines, script and hunks.
pub struct FileDiff<'a> {
    la: Vec<&'a [u8]>,
    lb: Vec<&'a [u8]>,
    ops: Vec<Op>,
    hunks: Vec<Hunk>,
}

/// `b` split into lines, each with its terminator.
pub fn lines(b: &[u8]) -> Vec<&[u8]> {
    b.split_inclusive(|&c| c == b'\n').collect()
}

/// The edit script from `a` to `b`: common prefix and suffix, an LCS of the middle when
/// it is small enough, else Myers'.
fn script(a: &[&[u8]], b: &[&[u8]]) -> Vec<Op> {
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (ma, mb) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    let mut ops = Vec::with_capacity(a.len().max(b.len()) + 1);
    ops.resize(pre, Op::Same);
    let (n, m) = (ma.len(), mb.len());
    if n == 0 || m == 0 {
        ops.extend(std::iter::repeat_n(Op::Del, n));
        ops.extend(std::iter::repeat_n(Op::Ins, m));
    } else if n.saturating_mul(m) <= MAX_CELLS {
        lcs(ma, mb, &mut ops);
    } else {
        myers(ma, mb, &mut ops);
    }
    ops.extend(std::iter::repeat_n(Op::Same, suf));
    ops
}

/// The script of `ma` → `mb` by a longest common subsequence (quadratic: small inputs).
fn lcs(ma: &[&[u8]], mb: &[&[u8]], ops: &mut Vec<Op>) {
    let (n, m) = (ma.len(), mb.len());
    // lcs[i][j]: LCS length of ma[i..] and mb[j..].
    let w = m + 1;
    let mut t = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            t[i * w + j] = if ma[i] == mb[j] {
                t[(i + 1) * w + j + 1] + 1
            } else {
                t[(i + 1) * w + j].max(t[i * w + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        if ma[i] == mb[j] {
            ops.push(Op::Same);
            i += 1;
            j += 1;
        } else if t[(i + 1) * w + j] >= t[i * w + j + 1] {
            ops.push(Op::Del);
            i += 1;
        } else {
            ops.push(Op::Ins);
            j += 1;
        }
    }
    ops.extend(std::iter::repeat_n(Op::Del, n - i));
    ops.extend(std::iter::repeat_n(Op::Ins, m - j));
}

/// The script of `ma` → `mb` by Myers' algorithm (linear memory; time-limited).
fn myers(ma: &[&[u8]], mb: &[&[u8]], ops: &mut Vec<Op>) {
    use similar::DiffOp;
    let deadline = Instant::now() + MYERS_TIME;
    let found =
        similar::capture_diff_slices_deadline(similar::Algorithm::Myers, ma, mb, Some(deadline));
    for d in found {
        match d {
            DiffOp::Equal { len, .. } => ops.extend(std::iter::repeat_n(Op::Same, len)),
            DiffOp::Delete { old_len, .. } => ops.extend(std::iter::repeat_n(Op::Del, old_len)),
            DiffOp::Insert { new_len, .. } => ops.extend(std::iter::repeat_n(Op::Ins, new_len)),
            DiffOp::Replace {
                old_len, new_len, ..
            } => {
                ops.extend(std::iter::repeat_n(Op::Del, old_len));
                ops.extend(std::iter::repeat_n(Op::Ins, new_len));
            }
        }
    }
}

/// Groups the changed ops of `ops` into hunks with [`CONTEXT`] lines around them (a change
/// at most twice that many ops after the previous one shares its hunk).
fn group(ops: &[Op]) -> Vec<Hunk> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0usize, 0usize);
    let mut k = 0;
    // Positions are walked once: (i, j) are the old/new line numbers at op `k`.
    let step = |op: Op, i: &mut usize, j: &mut usize| match op {
        Op::Same => {
            *i += 1;
            *j += 1;
        }
        Op::Del => *i += 1,
        Op::Ins => *j += 1,
    };
    while k < ops.len() {
        if ops[k] == Op::Same {
            step(ops[k], &mut i, &mut j);
            k += 1;
            continue;
        }
        // A change at k: the hunk starts CONTEXT ops before (all Same, or a previous
        // hunk's end, which is at least CONTEXT+1 Same ops back).
        let start = k
            .saturating_sub(CONTEXT)
            .max(out.last().map_or(0, |h: &Hunk| h.end));
        let back = k - start;
        let (old_at, new_at) = (i - back, j - back);
        let mut last = k;
        let mut e = k;
        while e < ops.len() && e <= last + 2 * CONTEXT {
            if ops[e] != Op::Same {
                last = e;
            }
            e += 1;
        }
        let end = (last + CONTEXT + 1).min(ops.len());
        let mut h = Hunk {
            start,
            end,
            old_at,
            new_at,
            old_len: 0,
            new_len: 0,
        };
        for &op in &ops[start..end] {
            h.old_len += usize::from(op != Op::Ins);
            h.new_len += usize::from(op != Op::Del);
        }
        for &op in &ops[k..end] {
            step(op, &mut i, &mut j);
        }
        k = end;
        out.push(h);
    }
    out
}

fn range(start: usize, count: usize) -> String {
    match count {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        _ => format!("{},{count}", start + 1),
    }
}

fn emit(out: &mut impl Write, tag: u8, line: &[u8]) -> io::Result<()> {
    out.write_all(&[tag])?;
    out.write_all(line)?;
    if !line.ends_with(b"\n") {
        out.write_all(b"\n\\ No newline at end of file\n")?;
    }
    Ok(())
}

impl<'a> FileDiff<'a> {
    /// The change from `a` to `b`.
    pub fn new(a: &'a [u8], b: &'a [u8]) -> FileDiff<'a> {
        let (la, lb) = (lines(a), lines(b));
        let ops = script(&la, &lb);
        let hunks = group(&ops);
        FileDiff { la, lb, ops, hunks }
    }

    /// The hunks, in order (hunk N is `hunks()[N - 1]`).
    pub fn hunks(&self) -> &[Hunk] {
        &self.hunks
    }

    /// Hunk `h`'s `@@ -a,b +c,d @@` line (without newline).
    pub fn header(&self, h: &Hunk) -> String {
        format!(
            "@@ -{} +{} @@",
            range(h.old_at, h.old_len),
            range(h.new_at, h.new_len)
        )
    }

    /// Hunk `h`'s lines: each with its tag (`b' '`, `b'-'`, `b'+'`) and bytes (with
    /// their terminator).
    pub fn body(&self, h: &Hunk) -> impl Iterator<Item = (u8, &'a [u8])> + '_ {
        let (mut i, mut j) = (h.old_at, h.new_at);
        self.ops[h.start..h.end].iter().map(move |op| match op {
            Op::Same => {
                i += 1;
                j += 1;
                (b' ', self.la[i - 1])
            }
            Op::Del => {
                i += 1;
                (b'-', self.la[i - 1])
            }
            Op::Ins => {
                j += 1;
                (b'+', self.lb[j - 1])
            }
        })
    }

    /// Writes hunk `h` as `stage diff` does (header line, then its lines).
    pub fn write_hunk(&self, h: &Hunk, out: &mut impl Write) -> io::Result<()> {
        writeln!(out, "{}", self.header(h))?;
        for (tag, line) in self.body(h) {
            emit(out, tag, line)?;
        }
        Ok(())
    }

    /// Every hunk, as `stage diff` writes them.
    pub fn write_all(&self, out: &mut impl Write) -> io::Result<()> {
        self.hunks.iter().try_for_each(|h| self.write_hunk(h, out))
    }

    /// The old side with the hunks whose number (from 1) `keep` accepts carried over from
    /// the new side (none: the old file; all: the new one).
    pub fn with(&self, keep: impl Fn(usize) -> bool) -> Vec<u8> {
        let size = |ls: &[&[u8]]| ls.iter().map(|l| l.len()).sum::<usize>();
        let mut out = Vec::with_capacity(size(&self.la).max(size(&self.lb)));
        let (mut i, mut j, mut h) = (0, 0, 0);
        for (k, op) in self.ops.iter().enumerate() {
            while h < self.hunks.len() && self.hunks[h].end <= k {
                h += 1;
            }
            let inside = h < self.hunks.len() && self.hunks[h].start <= k;
            let take_new = inside && keep(h + 1);
            match op {
                Op::Same => {
                    out.extend_from_slice(self.la[i]);
                    i += 1;
                    j += 1;
                }
                Op::Del => {
                    if !take_new {
                        out.extend_from_slice(self.la[i]);
                    }
                    i += 1;
                }
                Op::Ins => {
                    if take_new {
                        out.extend_from_slice(self.lb[j]);
                    }
                    j += 1;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(a: &str, b: &str) -> String {
        let mut v = Vec::new();
        FileDiff::new(a.as_bytes(), b.as_bytes())
            .write_all(&mut v)
            .unwrap();
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn hunks_as_git_writes_them() {
        assert_eq!(d("", "a\nb\n"), "@@ -0,0 +1,2 @@\n+a\n+b\n");
        assert_eq!(d("a\nb\n", ""), "@@ -1,2 +0,0 @@\n-a\n-b\n");
        assert_eq!(
            d("a\nb\nc\n", "a\nB\nc\n"),
            "@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
        );
        assert_eq!(
            d("x", "y"),
            "@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+y\n\\ No newline at end of file\n"
        );
        let a: String = (1..=20).map(|i| format!("{i}\n")).collect();
        let b: String = (1..=20)
            .map(|i| match i {
                2 => "two\n".to_string(),
                19 => "nineteen\n".to_string(),
                _ => format!("{i}\n"),
            })
            .collect();
        assert_eq!(
            d(&a, &b),
            "@@ -1,5 +1,5 @@\n 1\n-2\n+two\n 3\n 4\n 5\n@@ -16,5 +16,5 @@\n 16\n 17\n 18\n-19\n+nineteen\n 20\n"
        );
        // Changes six lines apart share a hunk, seven apart do not.
        let near: String = (1..=20)
            .map(|i| {
                if i == 3 || i == 9 {
                    format!("x{i}\n")
                } else {
                    format!("{i}\n")
                }
            })
            .collect();
        assert_eq!(
            FileDiff::new(a.as_bytes(), near.as_bytes()).hunks().len(),
            1
        );
        let far: String = (1..=20)
            .map(|i| {
                if i == 3 || i == 10 {
                    format!("x{i}\n")
                } else {
                    format!("{i}\n")
                }
            })
            .collect();
        assert_eq!(FileDiff::new(a.as_bytes(), far.as_bytes()).hunks().len(), 2);
    }

    /// Every subset of hunks gives a file; all gives the new side, none the old, and the
    /// diff of a subset's file against the new side is the other hunks.
    fn subsets(a: &[u8], b: &[u8]) {
        let f = FileDiff::new(a, b);
        let n = f.hunks().len();
        assert!(n <= 8);
        assert_eq!(f.with(|_| true), b);
        assert_eq!(f.with(|_| false), a);
        for mask in 0u32..(1 << n) {
            let keep = |h: usize| mask & (1 << (h - 1)) != 0;
            let mid = f.with(keep);
            let rest = FileDiff::new(&mid, b);
            assert_eq!(rest.hunks().len(), n - mask.count_ones() as usize);
            assert_eq!(rest.with(|_| true), b);
            // Discarding the kept ones from the new side gives the old one's rest.
            let back = f.with(|h| !keep(h));
            assert_eq!(
                FileDiff::new(a, &back).hunks().len(),
                n - mask.count_ones() as usize
            );
        }
    }

    #[test]
    fn subsets_round_trip_byte_for_byte() {
        let a: String = (1..=40).map(|i| format!("{i}\r\n")).collect();
        let b = a
            .replace("5\r\n", "five\r\n")
            .replace("20\r\n", "")
            .replace("33\r\n", "33\r\nnew\r\n");
        subsets(a.as_bytes(), b.as_bytes());
        let a2 = format!("{}last", a.replace("\r\n", "\n"));
        let b2 = format!(
            "first\n{}LAST",
            a.replace("\r\n", "\n").replace("21\n", "X\n")
        );
        subsets(a2.as_bytes(), b2.as_bytes());
        subsets(b"x", b"x\n");
        subsets(b"", b"only");
    }

    #[test]
    fn large_middles_use_myers_and_keep_hunks_apart() {
        let a: Vec<u8> = (0..300_000)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        let b = String::from_utf8(a.clone())
            .unwrap()
            .replace("line 10\n", "ten\n")
            .replace("line 150000\n", "mid\n")
            .replace("line 299990\n", "end\n");
        let f = FileDiff::new(&a, b.as_bytes());
        assert_eq!(f.hunks().len(), 3);
        assert_eq!(
            f.with(|h| h == 2),
            String::from_utf8(a.clone())
                .unwrap()
                .replace("line 150000\n", "mid\n")
                .as_bytes()
        );
    }
}
