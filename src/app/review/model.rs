//! The review UI's state and what each key does: the changed paths (from `status`), the
//! selected path's hunks (from `hunks`, for a modified text file) or its whole diff, the
//! selected hunk, a note being typed, and the change running on the worker thread.
//!
//! Invariants: every text kept here for display is already escaped (status lines are
//! quoted by the engine, hunk lines escaped by it, diff lines and messages escaped here
//! with `quote::escape`), so no byte of a name or of contents reaches the terminal raw;
//! every change is sent with the id of what is on screen, and a refusal because it
//! changed reloads the view; at most one change runs at a time, off the UI thread.

use std::sync::mpsc::{Receiver, channel};
use std::time::Instant;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use serde_json::Value;

use super::backend::Backend;
use crate::stage::request::Op;

/// One changed path.
pub struct Entry {
    /// Its status line (letters and quoted path), safe to show.
    pub line: String,
    /// The path as the requests name it.
    pub path: String,
    /// Its review id.
    pub id: String,
    /// A conflict with a host edit.
    pub conflict: bool,
}

/// One hunk, shown.
pub struct Hunk {
    /// Its number.
    pub n: usize,
    /// `@@ -a,b +c,d @@`.
    pub header: String,
    /// Its lines (tag first), escaped.
    pub lines: Vec<String>,
}

/// What the right pane shows.
pub enum Detail {
    /// A text file's hunks and the id they were computed with.
    Hunks { id: String, hunks: Vec<Hunk> },
    /// The path's whole diff (escaped lines): kept or discarded whole.
    Whole(Vec<String>),
    /// Nothing selected, or why it cannot be shown.
    Note(String),
}

/// What is being typed on the bottom line.
pub enum Input {
    /// Nothing.
    None,
    /// A note for the discard `req`.
    Note { req: Req, buf: String },
    /// A checkpoint number to rewind to.
    Rewind { buf: String },
}

/// A change to send: op, its argument (with the id), what the feedback line records.
#[derive(Clone)]
pub struct Req {
    op: &'static str,
    arg: String,
    path: String,
    hunks: Vec<usize>,
    to: Option<u64>,
}

/// A change running on the worker thread.
pub struct Busy {
    /// What it is, for the progress line.
    pub what: String,
    /// When it started.
    pub since: Instant,
    rx: Receiver<Result<Value, String>>,
}

/// The whole state.
pub struct Model {
    backend: Backend,
    since: Option<u64>,
    /// The changed paths.
    pub entries: Vec<Entry>,
    /// The selected path.
    pub sel: usize,
    /// The right pane.
    pub detail: Detail,
    /// The selected hunk (index into the hunks).
    pub hunk: usize,
    /// Lines scrolled in the right pane.
    pub scroll: u16,
    /// The last message (escaped).
    pub message: String,
    /// What is being typed.
    pub input: Input,
    /// The change running.
    pub busy: Option<Busy>,
    /// Quit asked.
    pub quit: bool,
}

fn esc(s: &str) -> String {
    crate::quote::escape(s.as_bytes()).into_owned()
}

impl Model {
    /// A model over `backend`, loaded.
    pub fn new(backend: Backend, since: Option<u64>) -> Model {
        let mut m = Model {
            backend,
            since,
            entries: Vec::new(),
            sel: 0,
            detail: Detail::Note(String::new()),
            hunk: 0,
            scroll: 0,
            message: String::new(),
            input: Input::None,
            busy: None,
            quit: false,
        };
        m.reload();
        m
    }

    /// The checkpoint shown changes are after (`--since`, `t`).
    pub fn since(&self) -> Option<u64> {
        self.since
    }

    /// The title: where, and which turn.
    pub fn title(&self) -> String {
        let turn = match self.since {
            Some(n) => format!(" since checkpoint {n}"),
            None => String::new(),
        };
        esc(&format!("{}{turn}", self.backend.describe()))
    }

    /// Reads the paths again (keeping the selected one when it is still there) and the
    /// selected path's detail.
    pub fn reload(&mut self) {
        let keep = self.entries.get(self.sel).map(|e| e.path.clone());
        let status = Op::Status {
            paths: Vec::new(),
            since: self.since,
        };
        match self.backend.stage(status) {
            Ok(a) => {
                let lines = a["lines"].as_array().cloned().unwrap_or_default();
                let changes = a["changes"].as_array().cloned().unwrap_or_default();
                self.entries = changes
                    .iter()
                    .zip(lines)
                    .map(|(c, l)| Entry {
                        line: esc(l.as_str().unwrap_or_default()),
                        path: c["path"].as_str().unwrap_or_default().to_string(),
                        id: c["id"].as_str().unwrap_or_default().to_string(),
                        conflict: c["conflict"] == Value::Bool(true),
                    })
                    .collect();
            }
            Err(e) => {
                self.entries.clear();
                self.message = esc(&e);
            }
        }
        self.sel = keep
            .and_then(|p| self.entries.iter().position(|e| e.path == p))
            .unwrap_or(self.sel)
            .min(self.entries.len().saturating_sub(1));
        self.load_detail();
    }

    fn load_detail(&mut self) {
        self.scroll = 0;
        self.hunk = 0;
        let Some(e) = self.entries.get(self.sel) else {
            self.detail = Detail::Note("nothing staged".into());
            return;
        };
        let paths = vec![e.path.clone()];
        if let Ok(a) = self.backend.stage(Op::Hunks {
            paths: paths.clone(),
        }) {
            let h = &a["hunks"];
            let hunks = h["hunks"].as_array().cloned().unwrap_or_default();
            self.detail = Detail::Hunks {
                id: h["id"].as_str().unwrap_or_default().to_string(),
                hunks: hunks
                    .iter()
                    .map(|x| Hunk {
                        n: x["n"].as_u64().unwrap_or(0) as usize,
                        header: esc(x["header"].as_str().unwrap_or_default()),
                        lines: x["lines"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|l| esc(l.as_str().unwrap_or_default()))
                            .collect(),
                    })
                    .collect(),
            };
            return;
        }
        self.detail = match self.backend.stage(Op::Diff { paths, since: None }) {
            Ok(a) => Detail::Whole(
                a["diff"]
                    .as_str()
                    .unwrap_or_default()
                    .lines()
                    .map(esc)
                    .collect(),
            ),
            Err(e) => Detail::Note(esc(&e)),
        };
    }

    /// Handles one key.
    pub fn key(&mut self, k: KeyEvent) {
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        match std::mem::replace(&mut self.input, Input::None) {
            Input::None => self.command(k),
            Input::Note { req, buf } => self.typing_note(k, req, buf),
            Input::Rewind { buf } => self.typing_rewind(k, buf),
        }
    }

    fn command(&mut self, k: KeyEvent) {
        let busy = self.busy.is_some();
        match k.code {
            KeyCode::Char('q') | KeyCode::Esc => self.quit = true,
            KeyCode::Down | KeyCode::Char('j') if self.sel + 1 < self.entries.len() => {
                self.sel += 1;
                self.load_detail();
            }
            KeyCode::Up | KeyCode::Char('k') if self.sel > 0 => {
                self.sel -= 1;
                self.load_detail();
            }
            KeyCode::Char('n') | KeyCode::Tab | KeyCode::Right => self.step_hunk(1),
            KeyCode::Char('p') | KeyCode::BackTab | KeyCode::Left => self.step_hunk(-1),
            KeyCode::PageDown => self.scroll = self.scroll.saturating_add(10),
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(10),
            KeyCode::Char('g') if !busy => self.reload(),
            _ if busy => self.message = "a change is running: wait for it".into(),
            KeyCode::Char('a') => self.start_hunk("apply", String::new()),
            KeyCode::Char('A') => self.start_path("apply", String::new()),
            KeyCode::Char(c @ ('d' | 'D')) => {
                if let Some(req) = self.request("discard", c == 'd') {
                    self.input = Input::Note {
                        req,
                        buf: String::new(),
                    };
                }
            }
            KeyCode::Char('r') => self.input = Input::Rewind { buf: String::new() },
            KeyCode::Char('t') => self.toggle_turn(),
            _ => {}
        }
    }

    /// Between every staged change and the last turn's (those after the last live
    /// checkpoint).
    fn toggle_turn(&mut self) {
        if self.since.take().is_none() {
            match self.backend.stage(Op::Log) {
                Ok(a) => {
                    let live = a["checkpoints"].as_array().into_iter().flatten();
                    self.since = live
                        .rev()
                        .filter(|c| c["ended"] != Value::Bool(true))
                        .find_map(|c| c["n"].as_u64());
                    if self.since.is_none() {
                        self.message = "no checkpoint: every change is this turn's".into();
                    }
                }
                Err(e) => self.message = esc(&e),
            }
        }
        self.reload();
    }

    fn step_hunk(&mut self, by: isize) {
        if let Detail::Hunks { hunks, .. } = &self.detail
            && !hunks.is_empty()
        {
            let n = hunks.len() as isize;
            self.hunk = (self.hunk as isize + by).clamp(0, n - 1) as usize;
        }
    }

    /// The change `op` of the selected hunk (`hunk`) or path, with the shown id.
    fn request(&mut self, op: &'static str, hunk: bool) -> Option<Req> {
        let e = self.entries.get(self.sel)?;
        if !hunk {
            return Some(Req {
                op,
                arg: format!("{}@{}", e.path, e.id),
                path: e.path.clone(),
                hunks: Vec::new(),
                to: None,
            });
        }
        match &self.detail {
            Detail::Hunks { id, hunks } if !hunks.is_empty() => {
                let n = hunks[self.hunk.min(hunks.len() - 1)].n;
                Some(Req {
                    op,
                    arg: format!("{}#{n}@{id}", e.path),
                    path: e.path.clone(),
                    hunks: vec![n],
                    to: None,
                })
            }
            _ => {
                self.message = "no hunks here: A keeps, D discards the whole path".into();
                None
            }
        }
    }

    fn start_hunk(&mut self, op: &'static str, note: String) {
        if let Some(r) = self.request(op, true) {
            self.start(r, note);
        }
    }

    fn start_path(&mut self, op: &'static str, note: String) {
        if let Some(r) = self.request(op, false) {
            self.start(r, note);
        }
    }

    fn typing_note(&mut self, k: KeyEvent, req: Req, mut buf: String) {
        match k.code {
            KeyCode::Enter => self.start(req, buf),
            KeyCode::Esc => self.message = "discard cancelled".into(),
            KeyCode::Backspace => {
                buf.pop();
                self.input = Input::Note { req, buf };
            }
            KeyCode::Char(c) if !c.is_control() => {
                buf.push(c);
                self.input = Input::Note { req, buf };
            }
            _ => self.input = Input::Note { req, buf },
        }
    }

    fn typing_rewind(&mut self, k: KeyEvent, mut buf: String) {
        match k.code {
            KeyCode::Enter => match buf.parse::<u64>() {
                Ok(n) => self.start(
                    Req {
                        op: "rewind",
                        arg: String::new(),
                        path: String::new(),
                        hunks: Vec::new(),
                        to: Some(n),
                    },
                    String::new(),
                ),
                Err(_) => self.message = "rewind: give a checkpoint number".into(),
            },
            KeyCode::Esc => self.message = "rewind cancelled".into(),
            KeyCode::Backspace => {
                buf.pop();
                self.input = Input::Rewind { buf };
            }
            KeyCode::Char(c) if c.is_ascii_digit() => {
                buf.push(c);
                self.input = Input::Rewind { buf };
            }
            _ => self.input = Input::Rewind { buf },
        }
    }

    /// Runs `r` on a worker thread; the feedback line is written there after it went
    /// through.
    fn start(&mut self, r: Req, note: String) {
        let (tx, rx) = channel();
        let b = self.backend.clone();
        let what = match r.op {
            "rewind" => format!("rewinding to checkpoint {}", r.to.unwrap_or(0)),
            op => format!("{op} {}", esc(&r.arg)),
        };
        std::thread::spawn(move || {
            let res = run(&b, &r, &note);
            let _ = tx.send(res);
        });
        self.busy = Some(Busy {
            what,
            since: Instant::now(),
            rx,
        });
    }

    /// Takes the worker's answer when it is there.
    pub fn poll(&mut self) {
        let Some(b) = &self.busy else {
            return;
        };
        let res = match b.rx.try_recv() {
            Ok(r) => r,
            Err(std::sync::mpsc::TryRecvError::Empty) => return,
            Err(_) => Err("the change's worker stopped".into()),
        };
        self.busy = None;
        self.message = match res {
            Ok(a) => {
                let lines: Vec<&str> = a["lines"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let text = if lines.is_empty() {
                    match a["rewound_to"].as_u64() {
                        Some(n) => format!("rewound to checkpoint {n}"),
                        None => "done".into(),
                    }
                } else {
                    lines.join("; ")
                };
                if text.contains("changed since it was shown") {
                    format!("it changed, shown again: {}", esc(&text))
                } else {
                    esc(&text)
                }
            }
            Err(e) => esc(&e),
        };
        self.reload();
    }
}

/// Sends `r`; when it went through, appends its feedback line (`note` on a discard).
fn run(b: &Backend, r: &Req, note: &str) -> Result<Value, String> {
    let paths = vec![r.arg.clone()];
    // A whole path's decision (and its note) is recorded by the apply or discard.
    let note_for = || (!note.is_empty()).then(|| note.to_string());
    let op = match r.op {
        "rewind" => Op::Rewind { to: r.to },
        "apply" => Op::Apply {
            paths,
            force: false,
            at: None,
            note: note_for(),
        },
        _ => Op::Discard {
            paths,
            note: note_for(),
        },
    };
    let a = b.stage(op)?;
    if r.op != "rewind" && !r.hunks.is_empty() && a["refused"].as_u64() == Some(0) {
        b.stage(Op::Feedback {
            paths: vec![r.path.clone()],
            decision: Some(r.op.to_string()),
            hunks: r.hunks.clone(),
            message: Some(note.to_string()),
        })?;
    }
    Ok(a)
}
