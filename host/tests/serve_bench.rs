//! `tandem serve-bench` and `tandem bench overhead` run as a user would: every format parsed
//! back, the counts right, the figures finite (no timing asserts); bad counts refused.

mod support;

use support::{TestResult, text};

fn tandem(args: &[&str]) -> std::process::Output {
    support::output(args, "error", &[("TANDEM_FPGA_SIM_MODE", "model")])
}

const SMALL: [&str; 6] = ["--seq-len", "8", "--d-model", "64", "--ffn", "32"];

#[test]
fn serve_bench_reports_throughput_and_latency_per_mix() -> TestResult {
    let mut args = vec![
        "serve-bench",
        "--requests",
        "12",
        "--concurrency",
        "3",
        "--backend",
        "cpu,auto",
        "--json",
    ];
    args.extend(SMALL);
    let o = tandem(&args);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(v["kind"], "serve_bench");
    let results = v["results"].as_array().ok_or("no results")?;
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["backend"], "cpu");
    assert_eq!(results[0]["mix"], "cpu");
    for r in results {
        assert_eq!(r["requests"], 12);
        assert_eq!(r["concurrency"], 3);
        for k in [
            "requests_per_s",
            "tokens_per_s",
            "p50_s",
            "p99_s",
            "max_s",
            "wall_s",
        ] {
            let x = r[k].as_f64().ok_or(k)?;
            assert!(x.is_finite() && x > 0.0, "{k} = {x}");
        }
        assert!(r["p50_s"].as_f64() <= r["p99_s"].as_f64());
        assert!(r["p99_s"].as_f64() <= r["max_s"].as_f64());
    }
    let json = args
        .iter()
        .position(|a| *a == "--json")
        .ok_or("no --json")?;
    args.splice(json..=json, ["--format", "csv"]);
    let o = tandem(&args);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let mut lines = out.lines();
    assert!(
        lines
            .next()
            .ok_or("no header")?
            .starts_with("backend,mix,requests")
    );
    assert_eq!(lines.count(), 2, "{out}");
    let o = tandem(&["serve-bench", "--requests", "0"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("requests (0)"), "{err}");
    Ok(())
}

#[test]
fn bench_overhead_counts_every_op() -> TestResult {
    let o = tandem(&[
        "bench",
        "overhead",
        "--ops",
        "500",
        "--repeats",
        "2",
        "--json",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(v["kind"], "bench_overhead");
    let rows = v["rows"].as_array().ok_or("no rows")?;
    let shapes: Vec<&str> = rows.iter().filter_map(|r| r["shape"].as_str()).collect();
    assert_eq!(shapes, ["chain", "independent"]);
    for r in rows {
        assert_eq!(r["ops_run"], 500);
        for k in ["plan_us_per_op", "execute_us_per_op", "total_us_per_op"] {
            let x = r[k].as_f64().ok_or(k)?;
            assert!(x.is_finite() && x >= 0.0, "{k} = {x}");
        }
    }
    let o = tandem(&["bench", "overhead", "--ops", "0"]);
    assert_eq!(o.status.code(), Some(1));
    // The op benches still parse beside the subcommand.
    let o = tandem(&["bench", "nosuchop"]);
    assert_eq!(o.status.code(), Some(2));
    Ok(())
}
