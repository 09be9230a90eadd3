//! Load execution: the [`Runner`] drives every repeat of every step, against
//! kvtier and each competitor in turn, in this process or in `--processes` child
//! processes whose histograms it merges, sampling the congestion control of
//! each system's sockets while it is under load (comparison rule 1).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use super::setup::Competitor;
use super::worker::{System, WorkerSpec, local_repeat, workers_of};
use super::{BenchConfig, GEN_THREADS};
use crate::builder::{RepeatInput, StepBuilder};
use crate::competitors::mooncake::SpawnedMooncake;
use crate::load::{ChildReport, Load, Progress, thread_cpu};
use crate::netobs::{Sampler, Sel};
use crate::record::{Mode, Step};
use crate::workloads::Workload;

/// The state of a sweep while its steps run.
pub(super) struct Runner<'a> {
    pub(super) cfg: &'a BenchConfig,
    /// The generator runtime (threads [`GEN_THREADS`]).
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) progress: Progress,
    pub(super) nonce: u64,
    pub(super) value_size: usize,
    /// Id of the next worker, unique over the run.
    pub(super) next_worker: u64,
    /// System name → congestion control seen on its sockets (rule 1).
    pub(super) observed_cc: BTreeMap<String, BTreeSet<String>>,
}

impl Runner<'_> {
    /// When to sample congestion control: the middle of the measured window.
    fn sample_at(&self) -> Duration {
        self.cfg.warmup + self.cfg.duration / 2
    }

    fn observe(&mut self, system: &str, seen: BTreeSet<String>) {
        self.observed_cc
            .entry(system.to_string())
            .or_default()
            .extend(seen);
    }

    /// One repeat of one step, with the congestion control of `sockets` sampled during it.
    fn observed_repeat(
        &mut self,
        system: &System,
        name: &str,
        sockets: &Sel,
        load: Load,
        label: &str,
    ) -> anyhow::Result<RepeatInput> {
        let sampler = Sampler::start(sockets.clone(), self.sample_at());
        let r = self.repeat(system, load, label);
        self.observe(name, sampler.finish());
        r
    }

    /// One repeat of Mooncake (closed loop, read → get, write → put).
    fn mooncake_repeat(
        &mut self,
        m: &SpawnedMooncake,
        load: Load,
        label: &str,
    ) -> anyhow::Result<(RepeatInput, String)> {
        let Load::Closed(c) = load else {
            anyhow::bail!("the Mooncake competitor runs closed-loop steps only (--concurrency)");
        };
        let op = match self.cfg.workload {
            Workload::Read => "get",
            Workload::Write => "put",
            w => anyhow::bail!(
                "the Mooncake competitor runs --workload read or write, not {}",
                w.name()
            ),
        };
        let mut pids = m.info.pids.clone();
        let at = self.sample_at();
        let mut sampler = None;
        let r = m.run(
            op,
            c * self.cfg.processes.max(1),
            self.cfg.warmup,
            self.cfg.duration,
            self.value_size,
            |pid| {
                pids.push(pid);
                sampler = Some(Sampler::start(
                    Sel {
                        ports: Vec::new(),
                        pids,
                    },
                    at,
                ));
            },
        )?;
        if let Some(s) = sampler {
            let seen = s.finish();
            self.observe(&m.name(), seen);
        }
        self.progress.done(label, &r.0);
        Ok(r)
    }

    /// One repeat of one step: in this process or in `processes` children.
    fn repeat(&mut self, system: &System, load: Load, label: &str) -> anyhow::Result<RepeatInput> {
        let p = self.cfg.processes.max(1);
        let per_proc = match load {
            Load::Closed(n) => Load::Closed(n),
            Load::Open { rate, pool } => Load::Open {
                rate: rate / f64::from(p),
                pool,
            },
        };
        let mut spec = WorkerSpec {
            system: system.clone(),
            workload: self.cfg.workload,
            value_size: self.value_size,
            nonce: self.nonce,
            load: per_proc,
            warmup_ms: self.cfg.warmup.as_millis() as u64,
            duration_ms: self.cfg.duration.as_millis() as u64,
            first_worker: self.next_worker,
            connections: self.cfg.connections,
            data_tcp_congestion: self.cfg.data_tcp_congestion.clone(),
            retries: self.cfg.retries,
            read_stripes: self.cfg.read_stripes,
        };
        self.next_worker += u64::from(p) * u64::from(workers_of(per_proc));
        let r = if p == 1 {
            let cpu = || thread_cpu(Some(GEN_THREADS));
            self.rt
                .block_on(local_repeat(&spec, &self.progress, label, &cpu))?
        } else {
            let exe = match &self.cfg.worker_exe {
                Some(e) => e.clone(),
                None => std::env::current_exe()?,
            };
            let mut children = Vec::new();
            for i in 0..p {
                spec.first_worker =
                    self.next_worker - u64::from(p - i) * u64::from(workers_of(per_proc));
                let mut child = Command::new(&exe)
                    .args(["bench", "--worker", &serde_json::to_string(&spec)?])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .with_context(|| format!("starting {} bench --worker", exe.display()))?;
                let mut out = BufReader::new(child.stdout.take().expect("piped"));
                let mut line = String::new();
                out.read_line(&mut line)?;
                anyhow::ensure!(line.trim() == "ready", "worker process said {line:?}");
                children.push((child, out));
            }
            for (c, _) in &mut children {
                writeln!(c.stdin.as_mut().expect("piped"), "go")?;
            }
            let mut merged: Option<RepeatInput> = None;
            for (mut c, mut out) in children {
                let mut line = String::new();
                out.read_line(&mut line)?;
                let st = c.wait()?;
                anyhow::ensure!(
                    st.success() && !line.is_empty(),
                    "worker process failed: {st}"
                );
                let r: ChildReport = serde_json::from_str(&line).context("worker output")?;
                let r = r.into_input()?;
                match &mut merged {
                    Some(m) => m.merge_process(&r)?,
                    None => merged = Some(r),
                }
            }
            merged.expect("p >= 2")
        };
        self.progress.done(label, &r);
        Ok(r)
    }

    /// One step for kvtier and every competitor: repeats alternate (kvtier, competitor
    /// 1, competitor 2, kvtier, ...) so that drift on a shared machine lands on
    /// every system alike instead of on whichever ran last. Returns kvtier's
    /// step, each competitor's, and how each competitor was driven.
    pub(super) fn step_all(
        &mut self,
        kv: &System,
        kv_sockets: &Sel,
        competitors: &[Competitor],
        load: Load,
        mode: Mode,
        name: &str,
    ) -> anyhow::Result<(Step, Vec<Step>, Vec<String>)> {
        let mut kb = StepBuilder::new(mode, self.cfg.processes);
        // Mooncake's driver runs the whole concurrency itself; the step keeps
        // kvtier's process count so that both carry the same label.
        let mut pbs: Vec<StepBuilder> = competitors
            .iter()
            .map(|_| StepBuilder::new(mode, self.cfg.processes))
            .collect();
        let mut how = vec![String::new(); competitors.len()];
        let k = self.cfg.repeat.max(1);
        for rep in 0..k {
            let label = format!("{name} rep {}/{k}", rep + 1);
            kb.add_repeat(self.observed_repeat(kv, "kvtier", kv_sockets, load, &label)?);
            for (i, competitor) in competitors.iter().enumerate() {
                let plabel = format!("{} {label}", competitor.name());
                let r = match competitor {
                    Competitor::Bench {
                        name,
                        system,
                        sockets,
                        client,
                        ..
                    } => {
                        how[i] = client.clone();
                        self.observed_repeat(system, name, sockets, load, &plabel)?
                    }
                    Competitor::Mooncake(m) => {
                        let (r, h) = self.mooncake_repeat(m, load, &plabel)?;
                        how[i] = h;
                        r
                    }
                };
                pbs[i].add_repeat(r);
            }
        }
        let steps = pbs
            .into_iter()
            .map(|b| b.build())
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok((kb.build()?, steps, how))
    }
}
