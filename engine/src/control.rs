//! The control socket: a Unix stream socket carrying one JSON object per line each way.
//!
//! Requests: {"cmd":"set","dir":"a2b"|"b2a"|"both","spec":{...}} (replaces that direction's whole
//! spec), {"cmd":"show"}, {"cmd":"clear"} (both directions back to pass-through; counters kept),
//! {"cmd":"ping"}. Every response has "ok"; failures carry "error".

use crate::fwd::DirShared;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// A request line's limit: a trace's opportunities travel in it (crate::trace::MAX_LINES).
const MAX_LINE: usize = 64 << 20;

pub struct Engine {
    pub a2b: Arc<DirShared>,
    pub b2a: Arc<DirShared>,
}

fn err(msg: impl Into<String>) -> Value {
    json!({"ok": false, "error": msg.into()})
}

impl Engine {
    fn dirs(&self, dir: &str) -> Option<Vec<&Arc<DirShared>>> {
        match dir {
            "a2b" => Some(vec![&self.a2b]),
            "b2a" => Some(vec![&self.b2a]),
            "both" => Some(vec![&self.a2b, &self.b2a]),
            _ => None,
        }
    }

    /// Apply a spec to one or both directions; all are validated before any is changed.
    pub fn set(&self, dir: &str, spec: &Value) -> Result<(), String> {
        let dirs = self.dirs(dir).ok_or_else(|| format!("dir: {dir:?} not accepted; accepted: a2b, b2a, both"))?;
        let built: Vec<_> = dirs.iter().map(|d| d.build(spec)).collect::<Result<_, _>>()?;
        for (d, m) in dirs.into_iter().zip(built) {
            d.apply(spec.clone(), m);
        }
        Ok(())
    }

    pub fn show(&self) -> Value {
        json!({
            "ok": true,
            "a2b": self.a2b.show(),
            "b2a": self.b2a.show(),
            "backend": "userspace",
            "version": VERSION,
            "a": self.a2b.rx.name,
            "b": self.b2a.rx.name,
        })
    }

    pub fn handle(&self, line: &str) -> Value {
        let req: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => return err(format!("bad JSON: {e}")),
        };
        match req.get("cmd").and_then(Value::as_str) {
            Some("ping") => json!({"ok": true, "version": VERSION}),
            Some("show") => self.show(),
            Some("clear") => match self.set("both", &json!({})) {
                Ok(()) => json!({"ok": true}),
                Err(e) => err(e),
            },
            Some("set") => {
                let dir = req.get("dir").and_then(Value::as_str).unwrap_or("");
                let Some(spec) = req.get("spec") else { return err("set: missing \"spec\"") };
                match self.set(dir, spec) {
                    Ok(()) => json!({"ok": true}),
                    Err(e) => err(e),
                }
            }
            Some(other) => err(format!("cmd: {other:?} not accepted; accepted: set, show, clear, ping")),
            None => err("missing \"cmd\""),
        }
    }
}

fn serve_conn(engine: Arc<Engine>, stream: UnixStream) {
    let mut out = match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.by_ref().take(MAX_LINE as u64).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.trim().is_empty() {
            continue;
        }
        let mut resp = engine.handle(line.trim()).to_string();
        resp.push('\n');
        if out.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// Accept connections forever, one thread each (the lab opens a handful at most).
pub fn serve(listener: UnixListener, engine: Arc<Engine>) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                let e = engine.clone();
                std::thread::spawn(move || serve_conn(e, s));
            }
            Err(_) => continue,
        }
    }
}

/// Bind the control socket, replacing a stale file but refusing when a live engine answers.
pub fn bind(path: &str) -> Result<UnixListener, String> {
    if std::path::Path::new(path).exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!("control socket {path} is in use by a running engine"));
        }
        std::fs::remove_file(path).map_err(|e| format!("cannot remove stale {path}: {e}"))?;
    }
    UnixListener::bind(path).map_err(|e| format!("cannot bind control socket {path}: {e}"))
}
