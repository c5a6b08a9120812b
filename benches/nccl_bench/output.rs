//! The nccl-tests text table: its header, a line per size and the footer's averages.

use crate::collective::Call;
use std::io::Write;

/// One placement's figures for one row.
pub struct Measure {
    pub time_us: f64,
    pub busbw: f64,
    pub algbw: f64,
    pub wrong: Option<usize>,
    /// NVIDIA NCCL's figures, where it ran.
    pub nccl: Option<Theirs>,
}

/// NVIDIA NCCL's figures for the same call.
pub struct Theirs {
    pub time_us: f64,
    pub busbw: f64,
    pub wrong: Option<usize>,
}

pub struct Table {
    pub baseline: bool,
    /// Width of the redop column (6 as nccl-tests, 9 when premulsum is listed).
    pub op_width: usize,
    pub busbw_sum: f64,
    pub busbw_n: usize,
    pub nccl_busbw_sum: f64,
    pub nccl_busbw_n: usize,
    pub nccl_wrong: usize,
    pub ratios: Vec<f64>,
    pub wrong: usize,
}

fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

impl Table {
    /// One placement's columns: time, algbw, busbw, #wrong, then NCCL's time, busbw, ratio.
    fn section(&self, c: [&str; 7]) -> String {
        let [t, a, b, w, nt, nb, r] = c;
        let mut s = format!("  {t:>7}  {a:>6}  {b:>6}  {w:>6}");
        if self.baseline {
            s += &format!("  {nt:>9}  {nb:>10}  {r:>6}");
        }
        s
    }

    /// The columns before the two placements, as wide as nccl-tests' (redop wider when needed).
    fn prefix(&self, size: &str, count: &str, dt: &str, op: &str, root: &str) -> String {
        let w = self.op_width;
        format!("{size:>12}  {count:>12}  {dt:>8}  {op:>w$}  {root:>6}")
    }

    /// A header line: the prefix with its first (blank) column starting with '#'.
    fn comment(line: String) -> String {
        format!("#{}", line.get(1..).unwrap_or(""))
    }

    pub fn header(&self) {
        let sec = self.section(["", "", "", "", "", "", ""]).len();
        let prefix = self.prefix("", "", "", "", "").len() - 1;
        println!("#");
        println!(
            "#{:prefix$}{:^sec$}{:^sec$}",
            "", "out-of-place", "in-place"
        );
        let cols = self.section([
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "nccl_time",
            "nccl_busbw",
            "ratio",
        ]);
        let head = self.prefix("size", "count", "type", "redop", "root");
        println!("{}{cols}{cols}  algo/proto/ch", Table::comment(head));
        let units = self.section(["(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", ""]);
        let head = self.prefix("(B)", "(elements)", "", "", "");
        println!("{}{units}{units}", Table::comment(head));
    }

    /// One size's line; `tuned` is what our tuner ran (algorithm/protocol/channels).
    pub fn row(&mut self, call: &Call, places: &[Option<Measure>; 2], tuned: &str) {
        let op = if call.coll.has_op() {
            call.op.name()
        } else {
            "none"
        };
        let mut line = self.prefix(
            &call.counts.size_bytes.to_string(),
            &call.counts.count.to_string(),
            call.dt.name(),
            op,
            &call.coll.root_column(call.root).to_string(),
        );
        for m in places {
            let Some(m) = m else {
                line += &self.section(["n/a"; 7]);
                continue;
            };
            let wrong = match m.wrong {
                Some(w) => {
                    self.wrong += w;
                    w.to_string()
                }
                None => "N/A".into(),
            };
            self.busbw_sum += m.busbw;
            self.busbw_n += 1;
            let (nt, nb, ratio) = match &m.nccl {
                Some(Theirs {
                    time_us: t,
                    busbw: b,
                    wrong,
                }) => {
                    let (t, b) = (*t, *b);
                    self.nccl_busbw_sum += b;
                    self.nccl_busbw_n += 1;
                    self.nccl_wrong += wrong.unwrap_or(0);
                    let ratio = if b > 0.0 {
                        let r = m.busbw / b;
                        self.ratios.push(r);
                        format!("{r:.2}")
                    } else {
                        "n/a".into()
                    };
                    (fmt_time(t), format!("{b:.2}"), ratio)
                }
                None => ("n/a".into(), "n/a".into(), "n/a".into()),
            };
            line += &self.section([
                &fmt_time(m.time_us),
                &format!("{:.2}", m.algbw),
                &format!("{:.2}", m.busbw),
                &wrong,
                &nt,
                &nb,
                &ratio,
            ]);
        }
        println!("{line}  {tuned}");
        let _ = std::io::stdout().flush();
    }

    pub fn footer(&self, checked: bool) {
        let stat = |label: &str, value: String| println!("# {label:<21}: {value}");
        if checked {
            let verdict = if self.wrong == 0 { "OK" } else { "FAILED" };
            stat("Wrong values", format!("{} {verdict}", self.wrong));
        }
        let avg = if self.busbw_n > 0 {
            self.busbw_sum / self.busbw_n as f64
        } else {
            0.0
        };
        stat("Avg bus bandwidth", format!("{avg:.4}"));
        if self.baseline {
            if checked {
                let why = if self.nccl_wrong == 0 {
                    ""
                } else {
                    " (NVIDIA NCCL is outside the tolerance too: the check may be too strict)"
                };
                stat("NCCL wrong values", format!("{}{why}", self.nccl_wrong));
            }
            if self.nccl_busbw_n > 0 {
                let avg = self.nccl_busbw_sum / self.nccl_busbw_n as f64;
                stat("NCCL avg bus bandwidth", format!("{avg:.4}"));
            }
            if self.ratios.is_empty() {
                stat("Avg ratio vs NCCL", "n/a (no size ran on both)".into());
            } else {
                let n = self.ratios.len() as f64;
                let mean = self.ratios.iter().sum::<f64>() / n;
                let geo = (self.ratios.iter().map(|r| r.max(1e-12).ln()).sum::<f64>() / n).exp();
                stat(
                    "Avg ratio vs NCCL",
                    format!(
                        "{mean:.4} (busbw ours/NCCL, mean of {} values; geometric mean {geo:.4})",
                        self.ratios.len()
                    ),
                );
            }
        }
        println!("#");
    }
}
