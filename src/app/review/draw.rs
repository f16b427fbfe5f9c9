//! Drawing the review UI: the changed paths on the left (conflicts in red), the selected
//! path's hunks or diff on the right (added lines green, removed red, the selected hunk's
//! header reversed and kept in view), a message or progress line, and the keys.
//!
//! Invariants: pure function of the model and the frame's size (any size works, 80×24
//! included: the left pane takes a third, at most 40 columns); shows only text the model
//! holds escaped.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, List, ListItem, ListState, Paragraph};

use super::model::{Detail, Input, Model};

/// The keys, as the bottom line shows them.
pub const KEYS: &str =
    "↑↓ path n/p hunk a/A keep hunk/path d/D discard hunk/path r rewind t turn q quit";

/// Draws the whole screen.
pub fn draw(f: &mut Frame<'_>, m: &Model) {
    let [main, msg, keys] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let left = (main.width / 3).clamp(16, 40);
    let [paths, diff] =
        Layout::horizontal([Constraint::Length(left), Constraint::Min(10)]).areas(main);
    draw_paths(f, m, paths);
    draw_detail(f, m, diff);
    f.render_widget(Paragraph::new(bottom(m)), msg);
    f.render_widget(
        Paragraph::new(KEYS).style(Style::new().add_modifier(Modifier::DIM)),
        keys,
    );
}

fn draw_paths(f: &mut Frame<'_>, m: &Model, r: Rect) {
    let items: Vec<ListItem<'_>> = m
        .entries
        .iter()
        .map(|e| {
            let st = if e.conflict {
                Style::new().fg(Color::Red)
            } else {
                Style::new()
            };
            ListItem::new(e.line.as_str()).style(st)
        })
        .collect();
    let title = match m.since() {
        Some(n) => format!(" {} changed since #{n} ", m.entries.len()),
        None => format!(" {} changed ", m.entries.len()),
    };
    let list = List::new(items)
        .block(Block::bordered().title(title))
        .highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol("> ");
    let mut st = ListState::default();
    if !m.entries.is_empty() {
        st.select(Some(m.sel));
    }
    f.render_stateful_widget(list, r, &mut st);
}

fn tagged(l: &str) -> Line<'_> {
    let st = match l.as_bytes().first() {
        Some(b'+') => Style::new().fg(Color::Green),
        Some(b'-') => Style::new().fg(Color::Red),
        Some(b'@') => Style::new().fg(Color::Cyan),
        Some(b'\\') => Style::new().add_modifier(Modifier::DIM),
        _ => Style::new(),
    };
    Line::styled(l, st)
}

fn draw_detail(f: &mut Frame<'_>, m: &Model, r: Rect) {
    let (lines, title, at): (Vec<Line<'_>>, String, usize) = match &m.detail {
        Detail::Hunks { hunks, .. } => {
            let mut lines = Vec::new();
            let mut at = 0;
            for (i, h) in hunks.iter().enumerate() {
                let mut st = Style::new().fg(Color::Cyan);
                if i == m.hunk {
                    at = lines.len();
                    st = st.add_modifier(Modifier::REVERSED | Modifier::BOLD);
                }
                let mark = if i == m.hunk { "▶" } else { " " };
                lines.push(Line::from(Span::styled(
                    format!("{mark}#{} {}", h.n, h.header),
                    st,
                )));
                lines.extend(h.lines.iter().map(|l| tagged(l)));
            }
            let n = hunks.len();
            (lines, format!(" hunk {} of {n} ", (m.hunk + 1).min(n)), at)
        }
        Detail::Whole(ls) => (
            ls.iter().map(|l| tagged(l)).collect(),
            " whole path ".into(),
            0,
        ),
        Detail::Note(s) => (vec![Line::raw(s.as_str())], String::new(), 0),
    };
    // Keep the selected hunk's header in view, then the user's own scrolling.
    let height = r.height.saturating_sub(2) as usize;
    let base = at.saturating_sub(height / 4);
    let top = (base + m.scroll as usize).min(lines.len().saturating_sub(1));
    let name = m.entries.get(m.sel).map(|e| e.line.as_str()).unwrap_or("");
    let p = Paragraph::new(Text::from(lines))
        .block(Block::bordered().title(format!(" {name} —{title}")))
        .scroll((top.min(u16::MAX as usize) as u16, 0));
    f.render_widget(p, r);
}

fn bottom(m: &Model) -> Line<'_> {
    match &m.input {
        Input::Note { buf, .. } => Line::from(vec![
            Span::styled(
                "note for the agent (Enter discards, Esc cancels): ",
                Style::new().fg(Color::Yellow),
            ),
            Span::raw(crate::quote::escape(buf.as_bytes()).into_owned()),
        ]),
        Input::Rewind { buf } => Line::from(vec![
            Span::styled(
                "rewind to checkpoint (Enter, Esc cancels): ",
                Style::new().fg(Color::Yellow),
            ),
            Span::raw(buf.as_str()),
        ]),
        Input::None => match &m.busy {
            Some(b) => {
                const SPIN: [&str; 4] = ["|", "/", "-", "\\"];
                let t = b.since.elapsed();
                let s = SPIN[(t.as_millis() / 150) as usize % 4];
                Line::styled(
                    format!("{s} {} … {:.1}s", b.what, t.as_secs_f32()),
                    Style::new().fg(Color::Yellow),
                )
            }
            None if m.message.is_empty() => Line::raw(m.title()),
            None => Line::raw(m.message.as_str()),
        },
    }
}
