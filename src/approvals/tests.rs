use super::*;
use std::sync::mpsc::channel;

fn req(uid: u32, path: &str) -> Request {
    Request {
        op: "open",
        paths: vec![path.as_bytes().to_vec()],
        need: "write",
        uid,
        gid: uid,
        pid: 42,
        rule: None,
        generation: 0,
        checks: vec![(false, crate::policy::Need::Write)],
        retry: false,
    }
}

/// A directory change (`create` of `path`) by `uid`.
fn change(uid: u32, path: &str) -> Request {
    Request {
        op: "create",
        retry: true,
        ..req(uid, path)
    }
}

/// The id of a held request (panics if it was not held).
#[track_caller]
fn id(h: Hold) -> u64 {
    match h {
        Hold::Held(id) => id,
        Hold::Posted(..) => panic!("posted, not held"),
        Hold::Refused(_, by) => panic!("refused: {by}"),
    }
}

/// Why a request was refused at once (panics if it was held or posted).
#[track_caller]
fn refused(h: Hold) -> &'static str {
    match h {
        Hold::Refused(_, by) => by,
        Hold::Held(_) | Hold::Posted(..) => panic!("not refused"),
    }
}

fn none() -> Resume {
    Box::new(|_| {})
}

type Table = (
    Approvals,
    std::sync::mpsc::Receiver<(Resume, Outcome)>,
    std::sync::mpsc::Receiver<Event>,
);

/// A table with one approver, whose continuations report their outcome on a channel.
fn table(cap: usize) -> Table {
    table_timing(cap, Duration::from_secs(60))
}

/// [`table`] with this ask timeout.
fn table_timing(cap: usize, timeout: Duration) -> Table {
    let a = Approvals::new(cap, timeout);
    let (rtx, rrx) = channel();
    let (etx, erx) = channel();
    a.connect(
        rtx,
        Box::new(move |e| {
            let _ = etx.send(e);
        }),
    );
    a.set_approvers(1);
    (a, rrx, erx)
}

fn resumed(rx: &std::sync::mpsc::Receiver<(Resume, Outcome)>) -> Vec<Outcome> {
    rx.try_iter()
        .map(|(r, o)| {
            r(o);
            o
        })
        .collect()
}

#[test]
fn without_an_approver_nothing_is_held() {
    let a = Approvals::new(4, Duration::from_secs(1));
    let (rtx, _r) = channel();
    let (etx, _e) = channel();
    a.connect(
        rtx,
        Box::new(move |e| {
            let _ = etx.send(e);
        }),
    );
    assert_eq!(
        refused(a.hold(req(1000, "docs/a"), none(), None)),
        "no-approver"
    );
    assert!(a.is_empty());
}

#[test]
fn the_cap_refuses_at_once() {
    let (a, _r, _e) = table(2);
    id(a.hold(req(1, "a"), none(), None));
    id(a.hold(req(1, "b"), none(), None));
    assert_eq!(refused(a.hold(req(1, "c"), none(), None)), "held-limit");
    assert_eq!(a.len(), 2);
}

#[test]
fn the_first_answer_wins_and_runs_the_continuation_once() {
    let (a, r, e) = table(8);
    let id = id(a.hold(req(1000, "docs/a"), none(), None));
    assert!(matches!(e.try_recv(), Ok(Event::Ask(h)) if h.id == id));
    assert!(a.decide(id, true, Remember::Once, 0).is_ok());
    assert!(
        a.decide(id, false, Remember::Once, 0).is_err(),
        "a late answer"
    );
    let outs = resumed(&r);
    assert_eq!(outs.len(), 1);
    assert!(outs[0].allow && outs[0].by == "approver" && outs[0].approver == Some(0));
    assert!(matches!(e.try_recv(), Ok(Event::Done { allow: true, .. })));
}

#[test]
fn remembered_paths_are_per_uid_cover_below_and_end_at_reload() {
    let (a, _r, _e) = table(8);
    let id = id(a.hold(req(1000, "docs"), none(), None));
    a.decide(id, true, Remember::Path, 0).unwrap();
    assert!(a.remembered(1000, b"docs"));
    assert!(a.remembered(1000, b"docs/x/y"));
    assert!(!a.remembered(1000, b"docsx"), "a sibling is not below");
    assert!(!a.remembered(1001, b"docs"), "never for another uid");
    a.reload(|_| Redecide::Keep);
    assert!(!a.remembered(1000, b"docs"), "forgotten at reload");
}

#[test]
fn a_denial_is_never_remembered() {
    let (a, _r, _e) = table(8);
    let id = id(a.hold(req(1000, "docs"), none(), None));
    a.decide(id, false, Remember::Path, 0).unwrap();
    assert!(!a.remembered(1000, b"docs"));
}

#[test]
fn timeouts_reload_reaping_and_shutdown_end_requests() {
    let (a, r, _e) = table_timing(8, Duration::ZERO);
    id(a.hold(req(1, "t"), none(), None));
    assert_eq!(a.expire(Instant::now()), None, "timed out, nothing left");
    assert_eq!(resumed(&r)[0].by, "timeout");

    let (a, r, _e) = table(8);
    id(a.hold(req(1, "allow"), none(), None));
    id(a.hold(req(1, "refuse"), none(), None));
    id(a.hold(req(1, "keep"), none(), None));
    a.reload(|q| match &q.paths[0][..] {
        b"allow" => Redecide::Allow,
        b"refuse" => Redecide::Refuse,
        _ => Redecide::Keep,
    });
    let outs = resumed(&r);
    assert_eq!(outs.len(), 2);
    assert!(outs.iter().all(|o| o.by == "reload"));
    assert_eq!(outs.iter().filter(|o| o.allow).count(), 1);
    assert_eq!(a.len(), 1);

    let mut q = req(1, "k");
    q.pid = 77;
    id(a.hold(q, none(), None));
    a.reap(|pid| pid == 77);
    assert_eq!(resumed(&r)[0].by, "killed");
    assert_eq!(a.len(), 1);

    let (tx, rx) = channel();
    let (a2, _r2, _e2) = table(8);
    id(a2.hold(
        req(1, "s"),
        Box::new(move |o| {
            let _ = tx.send(o);
        }),
        None,
    ));
    a2.shutdown();
    let o = rx
        .try_recv()
        .expect("answered at shutdown, on the caller's thread");
    assert_eq!((o.allow, o.by), (false, "shutdown"));
    assert_eq!(
        refused(a2.hold(req(1, "late"), none(), None)),
        "no-approver"
    );
}

/// A continuation that reports its outcome on `tx`.
fn report(tx: &std::sync::mpsc::Sender<(&'static str, Outcome)>, what: &'static str) -> Resume {
    let tx = tx.clone();
    Box::new(move |o| {
        let _ = tx.send((what, o));
    })
}

#[test]
fn a_uid_with_fewer_held_makes_room_by_refusing_the_oldest_of_the_uid_with_most() {
    let (a, r, e) = table(4);
    let (tx, rx) = channel();
    let ids: Vec<u64> = (0..4)
        .map(|i| id(a.hold(req(1000, &format!("a{i}")), report(&tx, "1000"), None)))
        .collect();
    // One uid alone may take every slot, and is then refused itself.
    assert_eq!(
        refused(a.hold(req(1000, "more"), none(), None)),
        "held-limit"
    );
    while e.try_recv().is_ok() {}
    // Another uid is held: the longest-held request of uid 1000 is refused to make room.
    let b1 = id(a.hold(req(1001, "b1"), report(&tx, "1001"), None));
    assert_eq!(a.len(), 4);
    resumed(&r);
    assert_eq!(
        rx.try_iter().collect::<Vec<_>>(),
        vec![("1000", Outcome::deny("held-limit"))]
    );
    assert!(
        matches!(e.try_recv(), Ok(Event::Done { id, allow: false, by: "held-limit" }) if id == ids[0]),
        "approvers learn it ended, before the new ask"
    );
    assert!(matches!(e.try_recv(), Ok(Event::Ask(h)) if h.id == b1));
    assert!(
        a.decide(ids[0], true, Remember::Once, 0).is_err(),
        "it is gone"
    );
    // 1001 holds 1 < 3: again the oldest of 1000 goes; then 2 each, and 1001 is refused.
    id(a.hold(req(1001, "b2"), none(), None));
    assert!(a.decide(ids[1], true, Remember::Once, 0).is_err());
    assert_eq!(refused(a.hold(req(1001, "b3"), none(), None)), "held-limit");
    // A third uid: uids 1000 and 1001 tie at 2, the longest held of them goes (1000's).
    id(a.hold(req(1002, "c1"), none(), None));
    assert!(a.decide(ids[2], true, Remember::Once, 0).is_err());
    let uids: Vec<u32> = a.held().iter().map(|h| h.req.uid).collect();
    assert_eq!(uids, vec![1000, 1001, 1001, 1002]);
    // The counts follow every way a request ends.
    a.decide(ids[3], false, Remember::Once, 0).unwrap();
    assert_eq!(a.inner.lock().per_uid.get(&1000), None);
    a.shutdown();
    assert!(a.inner.lock().per_uid.is_empty());
}

#[test]
fn a_directory_change_is_refused_after_its_hold_and_its_question_stays() {
    let (a, r, e) = table(16);
    let a = a.with_dir_hold(Duration::from_secs(1));
    let (tx, rx) = channel();
    let t0 = Instant::now();
    let first = id(a.hold(
        change(1000, "docs/new"),
        report(&tx, "caller"),
        Some(report(&tx, "late")),
    ));
    assert!(matches!(e.try_recv(), Ok(Event::Ask(h)) if h.id == first && h.req.retry));
    // The next deadline is the directory hold, not the ask timeout.
    let next = a.expire(t0).expect("something is held");
    assert!(next <= t0 + Duration::from_secs(1) + Duration::from_millis(50));
    // It runs out: the caller is refused, the question stays (no `done`).
    a.expire(t0 + Duration::from_secs(2));
    resumed(&r);
    assert_eq!(
        rx.try_iter().collect::<Vec<_>>(),
        vec![("caller", Outcome::deny("dir-hold"))]
    );
    assert!(
        e.try_recv().is_err(),
        "no event: the question is still open"
    );
    assert_eq!(a.held().len(), 1);
    assert!(a.held()[0].req.retry);
    // Its asker dying does not close it: another process of the uid may retry.
    a.reap(|_| true);
    assert_eq!(a.len(), 1);
    // Meanwhile that uid's further askable changes in docs are refused, unasked ...
    assert_eq!(
        refused(a.hold(change(1000, "docs/other"), none(), None)),
        "dir-pending"
    );
    let mut rename = change(1000, "src/x");
    rename.op = "rename";
    rename.paths.push(b"docs/x".to_vec());
    assert_eq!(refused(a.hold(rename, none(), None)), "dir-pending");
    // ... but not elsewhere, not another uid's, not an open's.
    let elsewhere = id(a.hold(change(1000, "src/y"), none(), None));
    id(a.hold(change(1001, "docs/z"), none(), None));
    id(a.hold(req(1000, "docs/a.md"), none(), None));
    assert!(!a.remembered(1000, b"docs/new"));
    // A later allow (once): the late audit runs, and the retry passes for a while.
    a.decide(first, true, Remember::Once, 7).unwrap();
    resumed(&r);
    let late = rx.try_iter().collect::<Vec<_>>();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].0, "late");
    assert!(late[0].1.allow && late[0].1.approver == Some(7));
    assert!(a.remembered(1000, b"docs/new"));
    assert!(!a.remembered(1000, b"docs/new/below"), "exactly that path");
    assert!(!a.remembered(1001, b"docs/new"), "never another uid");
    // The question is closed: the uid's next change in docs is held again.
    id(a.hold(change(1000, "docs/again"), none(), None));
    // Answered in time: it proceeds, nothing is remembered.
    a.decide(elsewhere, true, Remember::Once, 7).unwrap();
    assert!(!a.remembered(1000, b"src/y"));
    // A reload forgets the grant.
    a.reload(|_| Redecide::Keep);
    assert!(!a.remembered(1000, b"docs/new"));
}

#[test]
fn with_no_dir_hold_a_directory_change_is_posted_not_held() {
    let (a, _r, e) = table(16);
    let a = a.with_dir_hold(Duration::ZERO);
    let h = a.hold(change(1000, "docs/new"), none(), None);
    let Hold::Posted(q, _resume) = h else {
        panic!("not posted")
    };
    assert!(matches!(e.try_recv(), Ok(Event::Ask(h)) if h.id == q && h.req.retry));
    assert_eq!(a.len(), 1, "its question is open");
    assert_eq!(
        a.expire(Instant::now()).map(|_| ()),
        Some(()),
        "until the timeout"
    );
    assert_eq!(
        refused(a.hold(change(1000, "docs/b"), none(), None)),
        "dir-pending"
    );
    // Opens are still held.
    id(a.hold(req(1000, "docs/a.md"), none(), None));
    // A later "path" answer remembers the path and below until reload.
    a.decide(q, true, Remember::Path, 0).unwrap();
    assert!(a.remembered(1000, b"docs/new/x"));
}

#[test]
fn a_directory_change_that_times_out_first_is_an_ordinary_hold() {
    // --ask-timeout 1 s, --ask-dir-hold 5 s: held until the timeout, caller and question
    // end together, and approvers are not told to expect a retry.
    let (a, r, e) = table_timing(16, Duration::from_secs(1));
    let a = a.with_dir_hold(Duration::from_secs(5));
    let q = id(a.hold(change(1000, "docs/new"), none(), None));
    assert!(matches!(e.try_recv(), Ok(Event::Ask(h)) if h.id == q && !h.req.retry));
    a.expire(Instant::now() + Duration::from_secs(2));
    assert_eq!(resumed(&r)[0].by, "timeout");
    assert!(a.is_empty());
}

#[test]
fn a_posted_save_refuses_that_uids_other_requests_on_its_path_unasked() {
    let (a, _r, e) = table(16);
    let a = a.with_dir_hold(Duration::ZERO);
    let save = Request {
        op: "save",
        ..change(1000, "docs/a.md")
    };
    let Hold::Posted(q, _resume) = a.hold(save, none(), None) else {
        panic!("not posted")
    };
    assert!(matches!(e.try_recv(), Ok(Event::Ask(h)) if h.id == q && h.req.op == "save"));
    // The agent's in-place fallback on the same path: refused at once, nobody asked.
    assert_eq!(
        refused(a.hold(req(1000, "docs/a.md"), none(), None)),
        "pending"
    );
    assert!(e.try_recv().is_err(), "no second question");
    // Another path, or another uid, is asked as before.
    id(a.hold(req(1000, "docs/b.md"), none(), None));
    id(a.hold(req(1001, "docs/a.md"), none(), None));
    // The late allow lets that uid's retry through.
    a.decide(q, true, Remember::Once, 0).unwrap();
    assert!(a.remembered(1000, b"docs/a.md"));
    assert!(!a.remembered(1001, b"docs/a.md"));
}
