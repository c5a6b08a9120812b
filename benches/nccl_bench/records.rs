//! The machine-readable output of `--csv FILE` and `--json FILE`: one record per measured row
//! and placement, with what the run was (backend, GPU, versions, host, date, command line).
//!
//! CSV (RFC 4180): a header line, then one line per record; the run's fields repeat on every
//! line so that each line stands alone. JSON: `{"meta": {...}, "rows": [{...}, ...]}`, the
//! run's fields once in `meta`. A value that does not apply is an empty CSV field and a JSON
//! `null` (NCCL's figures without `--baseline`, `wrong` without `-c 1`). Bandwidths are GB/s
//! (10^9 bytes per second), times microseconds (per call, as `--stat` says); `ratio`
//! is our busbw over NCCL's (above 1: nccl-rs is faster). Both files are rewritten after every
//! collective's table, so a run that fails keeps the tables it finished.

use crate::backend::REASON_ENV;
use crate::collective::Call;
use crate::output::Measure;
use std::path::{Path, PathBuf};

/// What the run was: in JSON's `meta` once, on every CSV line.
pub struct Meta {
    /// `cuda` or `sim`.
    pub backend: &'static str,
    /// The name of the devices the ranks ran on (distinct names joined by ", ").
    pub gpu: String,
    /// `nccl::VERSION_STRING`, the NCCL version nccl-rs implements (the table's header line).
    pub nccl_rs_version: String,
    /// NVIDIA NCCL's version, with `--baseline`.
    pub nccl_version: Option<String>,
    pub hostname: String,
    /// When the run started, UTC, ISO 8601 (`2026-11-22T12:29:28Z`).
    pub date_utc: String,
    pub warmup_iters: usize,
    pub iters: usize,
    /// The command line, its arguments joined by spaces (quoted where a shell needs it).
    pub command: String,
}

/// One measured row and placement.
struct Row {
    collective: &'static str,
    placement: &'static str,
    size_bytes: usize,
    count: usize,
    dtype: &'static str,
    redop: &'static str,
    root: i64,
    nranks: usize,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: Option<usize>,
    nccl_time_us: Option<f64>,
    nccl_busbw: Option<f64>,
    nccl_wrong: Option<usize>,
    ratio: Option<f64>,
    /// Our tuner's algorithm/protocol/channels (`p2p` for send/receive).
    algo_proto_channels: String,
}

/// A value of a record, written in either format.
enum Value<'a> {
    Str(&'a str),
    Int(i64),
    /// A float, written in full (the shortest form that reads back as the same number).
    Float(f64),
    Null,
}

impl Value<'_> {
    fn csv(&self) -> String {
        match self {
            Value::Str(s) => csv_field(s),
            Value::Int(i) => i.to_string(),
            Value::Float(x) if x.is_finite() => x.to_string(),
            Value::Float(_) | Value::Null => String::new(),
        }
    }

    fn json(&self) -> String {
        match self {
            Value::Str(s) => json_string(s),
            Value::Int(i) => i.to_string(),
            Value::Float(x) if x.is_finite() => x.to_string(),
            Value::Float(_) | Value::Null => "null".into(),
        }
    }
}

fn opt_int(v: Option<usize>) -> Value<'static> {
    v.map_or(Value::Null, |v| Value::Int(v as i64))
}

fn opt_float(v: Option<f64>) -> Value<'static> {
    v.map_or(Value::Null, Value::Float)
}

impl Meta {
    fn fields(&self) -> Vec<(&'static str, Value<'_>)> {
        vec![
            ("backend", Value::Str(self.backend)),
            ("gpu", Value::Str(&self.gpu)),
            ("nccl_rs_version", Value::Str(&self.nccl_rs_version)),
            (
                "nccl_version",
                self.nccl_version.as_deref().map_or(Value::Null, Value::Str),
            ),
            ("hostname", Value::Str(&self.hostname)),
            ("date_utc", Value::Str(&self.date_utc)),
            ("warmup_iters", Value::Int(self.warmup_iters as i64)),
            ("iters", Value::Int(self.iters as i64)),
            ("command", Value::Str(&self.command)),
        ]
    }
}

impl Row {
    fn fields(&self) -> Vec<(&'static str, Value<'_>)> {
        vec![
            ("collective", Value::Str(self.collective)),
            ("placement", Value::Str(self.placement)),
            ("size_bytes", Value::Int(self.size_bytes as i64)),
            ("count", Value::Int(self.count as i64)),
            ("type", Value::Str(self.dtype)),
            ("redop", Value::Str(self.redop)),
            ("root", Value::Int(self.root)),
            ("nranks", Value::Int(self.nranks as i64)),
            ("time_us", Value::Float(self.time_us)),
            ("algbw_gbps", Value::Float(self.algbw)),
            ("busbw_gbps", Value::Float(self.busbw)),
            ("wrong", opt_int(self.wrong)),
            ("nccl_time_us", opt_float(self.nccl_time_us)),
            ("nccl_busbw_gbps", opt_float(self.nccl_busbw)),
            ("nccl_wrong", opt_int(self.nccl_wrong)),
            ("ratio", opt_float(self.ratio)),
            ("algo_proto_channels", Value::Str(&self.algo_proto_channels)),
        ]
    }
}

/// The records of a run and where they go.
pub struct Records {
    csv: Option<PathBuf>,
    json: Option<PathBuf>,
    meta: Meta,
    rows: Vec<Row>,
}

impl Records {
    /// Creates (empties) the files now, so that a path that cannot be written is reported
    /// before anything is measured.
    pub fn new(csv: Option<&Path>, json: Option<&Path>, meta: Meta) -> Result<Records, String> {
        for p in csv.iter().chain(json.iter()) {
            std::fs::File::create(p).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        }
        Ok(Records {
            csv: csv.map(Path::to_path_buf),
            json: json.map(Path::to_path_buf),
            meta,
            rows: Vec::new(),
        })
    }

    /// The records of one line of the table: a placement each, where it was measured.
    pub fn push(&mut self, call: &Call, places: &[Option<Measure>; 2], tuned: &str, nranks: usize) {
        let redop = if call.coll.has_op() {
            call.op.name()
        } else {
            "none"
        };
        for (m, placement) in places.iter().zip(["out-of-place", "in-place"]) {
            let Some(m) = m else { continue };
            let theirs = m.nccl.as_ref();
            self.rows.push(Row {
                collective: call.coll.name(),
                placement,
                size_bytes: call.counts.size_bytes,
                count: call.counts.count,
                dtype: call.dt.name(),
                redop,
                root: call.coll.root_column(call.root),
                nranks,
                time_us: m.time_us,
                algbw: m.algbw,
                busbw: m.busbw,
                wrong: m.wrong,
                nccl_time_us: theirs.map(|t| t.time_us),
                nccl_busbw: theirs.map(|t| t.busbw),
                nccl_wrong: theirs.and_then(|t| t.wrong),
                // As the table: none where NCCL's busbw is 0 (a 0-byte or too fast a call).
                ratio: theirs.filter(|t| t.busbw > 0.0).map(|t| m.busbw / t.busbw),
                algo_proto_channels: tuned.to_string(),
            });
        }
    }

    /// Writes every record so far to the files asked for.
    pub fn write(&self) -> Result<(), String> {
        let save = |p: &PathBuf, text: String| {
            std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display()))
        };
        if let Some(p) = &self.csv {
            save(p, self.to_csv())?;
        }
        if let Some(p) = &self.json {
            save(p, self.to_json())?;
        }
        Ok(())
    }

    fn to_csv(&self) -> String {
        let meta = self.meta.fields();
        let names = |fields: &[(&str, Value)]| -> Vec<String> {
            fields.iter().map(|(k, _)| k.to_string()).collect()
        };
        let mut out = [names(&Row::empty().fields()), names(&meta)]
            .concat()
            .join(",")
            + "\n";
        let meta_values: Vec<String> = meta.iter().map(|(_, v)| v.csv()).collect();
        for r in &self.rows {
            let values: Vec<String> = r.fields().iter().map(|(_, v)| v.csv()).collect();
            out += &[values, meta_values.clone()].concat().join(",");
            out += "\n";
        }
        out
    }

    fn to_json(&self) -> String {
        let object = |fields: Vec<(&str, Value)>| -> String {
            let members: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{}: {}", json_string(k), v.json()))
                .collect();
            format!("{{{}}}", members.join(", "))
        };
        let rows: Vec<String> = self
            .rows
            .iter()
            .map(|r| format!("    {}", object(r.fields())))
            .collect();
        let rows = if rows.is_empty() {
            "[]".to_string()
        } else {
            format!("[\n{}\n  ]", rows.join(",\n"))
        };
        format!(
            "{{\n  \"meta\": {},\n  \"rows\": {rows}\n}}\n",
            object(self.meta.fields())
        )
    }
}

impl Row {
    /// A row with no figures, for the names of the CSV header.
    fn empty() -> Row {
        Row {
            collective: "",
            placement: "",
            size_bytes: 0,
            count: 0,
            dtype: "",
            redop: "",
            root: 0,
            nranks: 0,
            time_us: 0.0,
            algbw: 0.0,
            busbw: 0.0,
            wrong: None,
            nccl_time_us: None,
            nccl_busbw: None,
            nccl_wrong: None,
            ratio: None,
            algo_proto_channels: String::new(),
        }
    }
}

/// A CSV field: quoted when it holds a comma, a quote or a line break (quotes doubled).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A JSON string literal: quotes, backslashes and control characters escaped.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// This process's command line, its arguments joined by spaces, each quoted for a POSIX shell
/// where it needs it. A simulator run that the bench started itself (CUDA unusable) drops the
/// `--backend sim` it appended: the line is what was typed.
pub fn command_line() -> String {
    let mut args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if std::env::var_os(REASON_ENV).is_some() && args.ends_with(&["--backend".into(), "sim".into()])
    {
        args.truncate(args.len() - 2);
    }
    args.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(a: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !a.is_empty() && a.chars().all(plain) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// Now, UTC, ISO 8601 to the second (`2026-11-22T12:29:28Z`).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    // Civil date from days since 1970-01-01 (H. Hinnant's days_from_civil, inverted).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
