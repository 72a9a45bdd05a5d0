//! Tables for people, JSON for scripts, progress on stderr, and the confirmation prompt.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use serde_json::Value;

use crate::Failure;

/// `println!` for the command's output: a reader that went away (`ferriq dlq list | head -1`)
/// ends the command quietly with exit 0, as Unix tools do, instead of a panic.
macro_rules! outln {
    () => {
        $crate::output::write_out(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::write_out(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// `eprintln!`/`eprint!` for progress and prompts: a closed stderr is no reason to fail.
macro_rules! errln {
    () => {
        $crate::output::write_err(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::output::write_err(format_args!($($arg)*), true)
    };
}
pub(crate) use errln;

macro_rules! err {
    ($($arg:tt)*) => {
        $crate::output::write_err(format_args!($($arg)*), false)
    };
}

/// Writes one line on stdout; exits quietly when the reader is gone.
pub(crate) fn write_out(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "error: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// Writes on stderr, ignoring a closed stderr.
pub(crate) fn write_err(text: std::fmt::Arguments<'_>, newline: bool) {
    let mut err = std::io::stderr().lock();
    let _ = if newline {
        writeln!(err, "{text}")
    } else {
        write!(err, "{text}")
    };
    let _ = err.flush();
}

/// Where results go: stdout, as a table or as JSON.
pub(crate) struct Output {
    pub(crate) json: bool,
}

impl Output {
    pub(crate) fn new(json: bool) -> Self {
        Output { json }
    }

    /// Prints `value` as pretty JSON.
    pub(crate) fn json(&self, value: &Value) {
        outln!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
        );
    }

    /// Prints a table: a header row, then each row, columns padded to their widest cell.
    pub(crate) fn table(&self, header: &[&str], rows: &[Vec<String>]) {
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let mut out = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    out.push_str(cell);
                } else {
                    let pad = widths[i] - cell.chars().count();
                    out.push_str(cell);
                    out.push_str(&" ".repeat(pad + 2));
                }
            }
            outln!("{}", out.trim_end());
        };
        line(header.to_vec());
        for row in rows {
            line(row.iter().map(String::as_str).collect());
        }
    }
}

/// Asks `question` on stderr and reads the answer from stdin: only `y` or `yes` goes on.
pub(crate) fn confirm(question: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    err!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    // No terminal and nothing piped: the answer is no.
    let _ = std::io::stdin().lock().read_line(&mut answer);
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failure::Aborted),
    }
}

/// Reports a long operation's progress on stderr: one updating line on a terminal, a line per
/// hundred otherwise (so logs stay short).
pub(crate) struct Progress {
    verb: &'static str,
    total: Option<u64>,
    terminal: bool,
    last: u64,
}

impl Progress {
    pub(crate) fn new(verb: &'static str, total: Option<u64>) -> Self {
        Progress {
            verb,
            total,
            terminal: std::io::stderr().is_terminal(),
            last: 0,
        }
    }

    pub(crate) fn update(&mut self, done: u64) {
        let of = self.total.map_or(String::new(), |t| format!(" of {t}"));
        if self.terminal {
            err!("\r{} {done}{of}", self.verb);
            let _ = std::io::stderr().flush();
        } else if done >= self.last + 100 || Some(done) == self.total {
            errln!("{} {done}{of}", self.verb);
        } else {
            return;
        }
        self.last = done;
    }

    pub(crate) fn finish(&self) {
        if self.terminal && self.last > 0 {
            errln!();
        }
    }
}

/// `2026-11-30T21:19:00Z` from unix ms.
pub(crate) fn timestamp(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.round(jiff::Unit::Second).unwrap_or(t).to_string())
        .unwrap_or_else(|_| ms.to_string())
}

/// `3d4h`, `2h5m`, `4m12s`, `9s`: the two largest units.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, mins, secs) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
    if days > 0 {
        format!("{days}d{hours}h")
    } else if hours > 0 {
        format!("{hours}h{mins}m")
    } else if mins > 0 {
        format!("{mins}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

/// At most `n` characters, on one line.
pub(crate) fn short(text: &str, n: usize) -> String {
    let one_line = text.replace(['\n', '\r', '\t'], " ");
    if one_line.chars().count() <= n {
        one_line
    } else {
        let mut s: String = one_line.chars().take(n.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// The unix ms of now.
pub(crate) fn now_ms() -> u64 {
    ferriq::clock::Clock::system().now_unix_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_cells_are_short() {
        assert_eq!(age(Duration::from_secs(9)), "9s");
        assert_eq!(age(Duration::from_secs(252)), "4m12s");
        assert_eq!(age(Duration::from_secs(7500)), "2h5m");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d4h");
        assert_eq!(short("a\nb", 10), "a b");
        assert_eq!(short("abcdef", 4), "abc…");
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
    }
}
