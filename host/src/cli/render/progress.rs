//! Renders the library's progress events (`tandem::progress`, target
//! [`tandem::progress::TARGET`]) on stderr: indicatif bars and spinners on a terminal, plain
//! `tandem: ...` lines otherwise (logs, CI).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};

/// The fields of one progress event.
#[derive(Debug, Default)]
struct Fields {
    task: String,
    event: String,
    done: u64,
    total: u64,
    unit: String,
    elapsed_ms: Option<u64>,
    message: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "task" => self.task = value.to_string(),
            "event" => self.event = value.to_string(),
            "unit" => self.unit = value.to_string(),
            "message" => self.message = value.to_string(),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "done" => self.done = value,
            "total" => self.total = value,
            "elapsed_ms" => self.elapsed_ms = Some(value),
            _ => {}
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record_u64(field, u64::try_from(value).unwrap_or(0));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

/// A count as people read it: `12.3 M cycles`, `17 ops`.
fn amount(n: f64, unit: &str) -> String {
    let (v, p) = if n >= 1e9 {
        (n / 1e9, "G")
    } else if n >= 1e6 {
        (n / 1e6, "M")
    } else if n >= 1e4 {
        (n / 1e3, "k")
    } else {
        return format!("{n:.0} {unit}");
    };
    format!("{v:.1} {p} {unit}").trim_end().to_string()
}

struct Running {
    started: Instant,
    bar: Option<ProgressBar>,
}

/// The layer: a bar per running task on a terminal, else lines.
pub struct ProgressLayer {
    terminal: bool,
    tasks: Mutex<HashMap<String, Running>>,
}

impl std::fmt::Debug for ProgressLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressLayer")
            .field("terminal", &self.terminal)
            .finish()
    }
}

impl ProgressLayer {
    /// Bars where `terminal`, else lines.
    pub fn new(terminal: bool) -> Self {
        Self {
            terminal,
            tasks: Mutex::new(HashMap::new()),
        }
    }

    fn bar(&self, f: &Fields) -> ProgressBar {
        let counted = !f.unit.is_empty();
        let bar = if f.total > 0 {
            ProgressBar::with_draw_target(Some(f.total), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        };
        let template = match (f.total > 0, counted) {
            (true, _) => "{spinner} {msg} [{bar:30}] {pos}/{len} {prefix} ({elapsed})",
            (false, true) => "{spinner} {msg}: {prefix} ({elapsed})",
            (false, false) => "{spinner} {msg} ({elapsed})",
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(f.message.clone());
        if f.total > 0 {
            bar.set_prefix(f.unit.clone());
        }
        let bar = bar.with_elapsed(Self::elapsed(f, Duration::ZERO));
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    }

    /// How long the work has run: as the event says, else as this layer saw it.
    fn elapsed(f: &Fields, seen: Duration) -> Duration {
        f.elapsed_ms.map(Duration::from_millis).unwrap_or(seen)
    }

    fn line(f: &Fields, elapsed: Duration) -> String {
        let elapsed = Self::elapsed(f, elapsed);
        let mut s = format!("tandem: {}", f.message);
        let secs = elapsed.as_secs_f64();
        match f.event.as_str() {
            "start" => s.push_str("..."),
            "update" => {
                let _ = write!(s, ": {}", amount(f.done as f64, &f.unit));
                if f.total > 0 {
                    let _ = write!(s, " of {}", f.total);
                }
                if secs > 0.0 {
                    let _ = write!(s, ", {}/s", amount(f.done as f64 / secs, &f.unit));
                }
            }
            _ => {
                let _ = write!(s, ": done in {secs:.1} s");
            }
        }
        s
    }
}

impl<S: tracing::Subscriber> Layer<S> for ProgressLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != tandem::progress::TARGET {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        match f.event.as_str() {
            "start" => {
                let bar = self.terminal.then(|| self.bar(&f));
                if !self.terminal {
                    eprintln!("{}", Self::line(&f, Duration::ZERO));
                }
                tasks.insert(
                    f.task.clone(),
                    Running {
                        started: Instant::now(),
                        bar,
                    },
                );
            }
            "update" => {
                let Some(t) = tasks.get(&f.task) else {
                    return;
                };
                match &t.bar {
                    Some(bar) if f.total > 0 => bar.set_position(f.done),
                    Some(bar) => {
                        let secs = Self::elapsed(&f, t.started.elapsed())
                            .as_secs_f64()
                            .max(1e-9);
                        bar.set_prefix(format!(
                            "{}, {}/s",
                            amount(f.done as f64, &f.unit),
                            amount(f.done as f64 / secs, &f.unit)
                        ));
                    }
                    None => eprintln!("{}", Self::line(&f, t.started.elapsed())),
                }
            }
            _ => {
                let Some(t) = tasks.remove(&f.task) else {
                    return;
                };
                match t.bar {
                    Some(bar) => bar.finish_and_clear(),
                    None => eprintln!("{}", Self::line(&f, t.started.elapsed())),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_amounts() {
        let f = Fields {
            task: "sim:attention".into(),
            event: "update".into(),
            done: 12_400_000,
            total: 0,
            unit: "cycles".into(),
            elapsed_ms: None,
            message: "simulating the attention kernel".into(),
        };
        assert_eq!(
            ProgressLayer::line(&f, Duration::from_secs(2)),
            "tandem: simulating the attention kernel: 12.4 M cycles, 6.2 M cycles/s"
        );
        let f = Fields {
            elapsed_ms: Some(4000),
            ..f
        };
        assert!(
            ProgressLayer::line(&f, Duration::from_secs(2)).ends_with(", 3.1 M cycles/s"),
            "the work's own elapsed time wins"
        );
        assert_eq!(amount(17.0, "ops"), "17 ops");
        assert_eq!(amount(25_000.0, "runs"), "25.0 k runs");
        let f = Fields {
            event: "start".into(),
            message: "building".into(),
            ..Fields::default()
        };
        assert_eq!(
            ProgressLayer::line(&f, Duration::ZERO),
            "tandem: building..."
        );
    }
}
