//! `strata-bench`: measures a running strata daemon against same-run baselines.
//!
//! Started by `bench/run.sh`, which builds the binaries, starts a private daemon,
//! imports the busybox test image and passes everything on the command line.
//! Figures: (1) create -> first exec -> destroy, (2) exec into a running sandbox,
//! (3) host memory of idle sandboxes, (4) image import and its deduplication,
//! (5) checkpoint and fork on a ~1 GiB rootfs, and the disk forks use,
//! (6) standby and resume: a ~100 MiB workload, many sandboxes in standby,
//! idle-timeout standby and resume on access, (7) setup reuse and pipeline
//! overhead, (8) network egress vs none, (9) the preview proxy vs a direct
//! connection to the sandbox port, (10) the E2B SDK's create + run + kill
//! round trip against the native API's, (13) state over time: a check of a
//! setup-sized sandbox and exec latency under it, rebase against recreating.

mod figures;
mod http1;
mod report;
mod stats;
mod sys;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use strata_client::Client;

use report::{Facts, Report};

/// Command-line configuration.
#[derive(Debug, Clone)]
pub struct Cfg {
    pub socket: PathBuf,
    pub strata: PathBuf,
    pub daemon_pid: i32,
    pub state_dir: PathBuf,
    pub images: PathBuf,
    pub image: String,
    pub work: PathBuf,
    pub out: Option<PathBuf>,
    pub runs: usize,
    pub cli_runs: usize,
    pub idle: usize,
    pub warmup: usize,
    pub import: String,
    pub big_mib: u64,
    pub standby_count: usize,
    pub standby_idle: usize,
    pub only: Vec<String>,
    pub date: String,
    pub commit: String,
    /// The daemon's TCP listener (`host:port`), for the E2B figure.
    pub listen: Option<String>,
    /// Python of the venv holding the pinned `e2b` SDK.
    pub e2b_python: PathBuf,
    /// Where the npm e2b SDKs are installed (`node_modules/e2b`, scripts/setup-host.sh).
    pub e2b_js: PathBuf,
}

const USAGE: &str =
    "usage: strata-bench --socket PATH --strata BIN --daemon-pid PID --state-dir DIR --images DIR --work DIR
       [--image NAME (busybox)] [--out docs/benchmarks.md] [--runs 200] [--cli-runs 50] [--idle 200]
       [--warmup 10] [--import auto|generated|PATH] [--big-mib 1024]
       [--standby-count 1000] [--standby-idle 20]
       [--only create,exec,idle,import,checkpoint,standby,pipeline,network,preview,e2b,warm,gvisor,state,pool,microvm] [--date S] [--commit S]
       [--listen HOST:PORT (the daemon's TCP listener, for e2b)] [--e2b-python /var/cache/strata/venv-e2b/bin/python] [--e2b-js /var/cache/strata/e2b-js]";

/// Figure names, in run order.
const FIGURES: [&str; 15] = [
    "create",
    "exec",
    "idle",
    "import",
    "checkpoint",
    "standby",
    "pipeline",
    "network",
    "preview",
    "e2b",
    "warm",
    "gvisor",
    "state",
    "pool",
    "microvm",
];

fn parse_args() -> Result<Cfg> {
    let mut c = Cfg {
        socket: PathBuf::new(),
        strata: PathBuf::new(),
        daemon_pid: 0,
        state_dir: PathBuf::new(),
        images: PathBuf::from("/var/cache/strata/images"),
        image: "busybox".into(),
        work: PathBuf::new(),
        out: None,
        runs: 200,
        cli_runs: 50,
        idle: 200,
        warmup: 10,
        import: "auto".into(),
        big_mib: 1024,
        standby_count: 1000,
        standby_idle: 20,
        only: vec![],
        date: String::new(),
        commit: String::new(),
        listen: None,
        e2b_python: PathBuf::from("/var/cache/strata/venv-e2b/bin/python"),
        e2b_js: PathBuf::from("/var/cache/strata/e2b-js"),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let k = args[i].clone();
        i += 1;
        if k == "-h" || k == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let v = args.get(i).cloned().with_context(|| format!("{k} needs a value\n{USAGE}"))?;
        i += 1;
        match k.as_str() {
            "--socket" => c.socket = v.into(),
            "--strata" => c.strata = v.into(),
            "--daemon-pid" => c.daemon_pid = v.parse().context("--daemon-pid")?,
            "--state-dir" => c.state_dir = v.into(),
            "--images" => c.images = v.into(),
            "--image" => c.image = v,
            "--work" => c.work = v.into(),
            "--out" => c.out = Some(v.into()),
            "--runs" => c.runs = v.parse().context("--runs")?,
            "--cli-runs" => c.cli_runs = v.parse().context("--cli-runs")?,
            "--idle" => c.idle = v.parse().context("--idle")?,
            "--warmup" => c.warmup = v.parse().context("--warmup")?,
            "--import" => c.import = v,
            "--big-mib" => c.big_mib = v.parse().context("--big-mib")?,
            "--standby-count" => c.standby_count = v.parse().context("--standby-count")?,
            "--standby-idle" => c.standby_idle = v.parse().context("--standby-idle")?,
            "--only" => c.only = v.split(',').map(str::to_string).filter(|s| !s.is_empty()).collect(),
            "--date" => c.date = v,
            "--commit" => c.commit = v,
            "--listen" => c.listen = Some(v),
            "--e2b-python" => c.e2b_python = v.into(),
            "--e2b-js" => c.e2b_js = v.into(),
            _ => bail!("unknown argument {k}\n{USAGE}"),
        }
    }
    if c.socket.as_os_str().is_empty()
        || c.strata.as_os_str().is_empty()
        || c.daemon_pid == 0
        || c.work.as_os_str().is_empty()
        || c.state_dir.as_os_str().is_empty()
    {
        bail!("--socket, --strata, --daemon-pid, --state-dir and --work are required\n{USAGE}");
    }
    if let Some(f) = c.only.iter().find(|f| !FIGURES.contains(&f.as_str())) {
        bail!("--only: unknown figure {f:?} (figures: {})", FIGURES.join(", "));
    }
    if c.runs == 0 || c.cli_runs == 0 || c.idle == 0 || c.big_mib == 0 || c.standby_count == 0 || c.standby_idle == 0 {
        bail!("run counts must be positive");
    }
    Ok(c)
}

/// Shared state of the figures.
pub struct Bench {
    pub cfg: Cfg,
    pub client: Client,
    pub report: Report,
}

impl Bench {
    fn wants(&self, fig: &str) -> bool {
        self.cfg.only.is_empty() || self.cfg.only.iter().any(|f| f == fig)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("strata-bench: error: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> Result<()> {
    let cfg = parse_args()?;
    let client = Client::unix(&cfg.socket);
    let info = client.info().await.context("daemon not reachable")?;
    println!(
        "strata-bench: daemon {} (pid {}), image {:?}",
        serde_json::to_string(&info).unwrap_or_default(),
        cfg.daemon_pid,
        cfg.image
    );
    client.get_image(&cfg.image).await.with_context(|| format!("image {:?} is not imported", cfg.image))?;
    let started = Instant::now();
    let load0 = loadavg();
    let mut b = Bench { cfg, client, report: Report::default() };

    let mut failed: Vec<String> = Vec::new();
    type Fig = for<'a> fn(&'a mut Bench) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + 'a>>;
    let figs: [(&str, Fig); 15] = [
        ("create", |b| Box::pin(figures::create::run(b))),
        ("exec", |b| Box::pin(figures::exec::run(b))),
        ("idle", |b| Box::pin(figures::idle::run(b))),
        ("import", |b| Box::pin(figures::import::run(b))),
        ("checkpoint", |b| Box::pin(figures::checkpoint::run(b))),
        ("standby", |b| Box::pin(figures::standby::run(b))),
        ("pipeline", |b| Box::pin(figures::pipeline::run(b))),
        ("network", |b| Box::pin(figures::network::run(b))),
        ("preview", |b| Box::pin(figures::preview::run(b))),
        ("e2b", |b| Box::pin(figures::e2b::run(b))),
        ("warm", |b| Box::pin(figures::warm::run(b))),
        ("gvisor", |b| Box::pin(figures::gvisor::run(b))),
        ("state", |b| Box::pin(figures::state::run(b))),
        ("pool", |b| Box::pin(figures::pool::run(b))),
        ("microvm", |b| Box::pin(figures::microvm::run(b))),
    ];
    for (name, f) in figs {
        if !b.wants(name) {
            continue;
        }
        let rows_before = b.report.rows.len();
        let t = Instant::now();
        println!("\n== {name} ==");
        if let Err(e) = f(&mut b).await {
            eprintln!("strata-bench: figure {name} failed: {e:#}");
            b.report.rows.push(report::Row::new(
                format!("{name}: ERROR"),
                format!("{e:#}"),
                "-",
                "-",
                "-",
                report::Verdict::Fail,
            ));
            failed.push(name.to_string());
        }
        report::print_rows(&b.report.rows[rows_before..]);
        println!("({name}: {})", stats::secs(t.elapsed()));
    }

    let (kernel, nproc, cpu, mem) = sys::machine();
    let facts = Facts {
        date: b.cfg.date.clone(),
        commit: b.cfg.commit.clone(),
        kernel,
        nproc,
        cpu,
        mem,
        wall: stats::secs(started.elapsed()),
        load: format!("{load0} -> {}", loadavg()),
    };
    println!(
        "\n== summary (kernel {}, nproc {}, {}, {}, load {}) ==",
        facts.kernel, facts.nproc, facts.cpu, facts.date, facts.load
    );
    report::print_rows(&b.report.rows);
    if let Some(out) = &b.cfg.out {
        std::fs::write(out, report::markdown(&b.report, &facts)).with_context(|| format!("write {}", out.display()))?;
        println!("\nwrote {}", out.display());
    }
    let fails = b.report.rows.iter().filter(|r| r.verdict == report::Verdict::Fail).count();
    println!(
        "{} targets passed, {fails} failed{}",
        b.report.rows.iter().filter(|r| r.verdict == report::Verdict::Pass).count(),
        if failed.is_empty() { String::new() } else { format!("; figures that errored: {}", failed.join(", ")) }
    );
    if !failed.is_empty() {
        bail!("{} figure(s) could not be measured", failed.len());
    }
    Ok(())
}

/// The first three fields of /proc/loadavg.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
