//! A peer of the daemon's control socket (JSON lines both ways), shared by the approvals
//! tests: connect (reading the greeting), send, receive, skip to the next event or answer.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

/// A peer of the control socket.
pub struct Peer {
    pub w: UnixStream,
    pub r: BufReader<UnixStream>,
}

impl Peer {
    /// Connects and reads the greeting.
    pub fn connect(sock: &Path) -> Peer {
        Peer::connect_hello(sock).0
    }

    /// Connects; also returns the greeting (`{"fencefs":1,"generation":N}`).
    pub fn connect_hello(sock: &Path) -> (Peer, Value) {
        let s = UnixStream::connect(sock).expect("connect to the control socket");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let r = BufReader::new(s.try_clone().unwrap());
        let mut p = Peer { w: s, r };
        let hello = p.recv();
        (p, hello)
    }

    /// Writes bytes as they are (garbage, partial lines).
    pub fn send_raw(&mut self, line: &[u8]) {
        self.w.write_all(line).unwrap();
    }

    /// Writes one command line.
    pub fn send(&mut self, v: Value) {
        let mut b = serde_json::to_vec(&v).unwrap();
        b.push(b'\n');
        self.send_raw(&b);
    }

    /// The next line, parsed.
    #[track_caller]
    pub fn recv(&mut self) -> Value {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("a line from the daemon");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}"))
    }

    /// The next line that is (`event`) or is not (`None`) an event.
    #[track_caller]
    pub fn next(&mut self, event: Option<&str>) -> Value {
        loop {
            let v = self.recv();
            match (event, v.get("event").and_then(Value::as_str)) {
                (None, None) => return v,
                (Some(e), Some(x)) if e == x => return v,
                _ => {}
            }
        }
    }

    /// Sends a command and returns its answer (events before it are skipped).
    #[track_caller]
    pub fn call(&mut self, v: Value) -> Value {
        self.send(v);
        self.next(None)
    }

    /// Connects and subscribes as an approver.
    pub fn subscribe(sock: &Path) -> Peer {
        let mut p = Peer::connect(sock);
        assert_eq!(p.call(json!({"cmd": "subscribe"}))["ok"], true);
        p
    }
}
