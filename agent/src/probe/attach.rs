//! One server process: its own copy of the kernel programs and maps,
//! attached with per-process scope. Dropping it detaches every probe.
use std::num::NonZeroU32;

use agent_common::{COMMAND_SLOTS, MAX_TEXT, ServerLayout, stat};
use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{UProbe, uprobe::UProbeScope},
};

use super::{Counters, ProbeError, Statement, decode_statement};
use crate::discover::{BinaryInfo, ServerProcess};

/// The kernel object built by `build.rs`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent-ebpf"));

#[derive(Clone, Copy, Debug)]
pub struct ProbeConfig {
    /// Text bytes copied per statement (at most `MAX_TEXT`).
    pub text_limit: u32,
    /// Ring buffer size in bytes (a power of two, at least one page).
    pub ring_bytes: u32,
}

pub struct AttachedServer {
    pub server: ServerProcess,
    pub binary: BinaryInfo,
    // Field order matters on drop: maps taken out of `ebpf` go first.
    events: RingBuf<MapData>,
    ebpf: Ebpf,
}

impl AttachedServer {
    pub fn attach(server: ServerProcess, binary: BinaryInfo, config: ProbeConfig) -> Result<Self, ProbeError> {
        let pid = server.pid;
        let layout = ServerLayout { text_limit: config.text_limit.min(MAX_TEXT as u32), ..binary.layout };
        let mut ebpf = EbpfLoader::new()
            .override_global("LAYOUT", &layout, true)
            .map_max_entries("EVENTS", config.ring_bytes)
            .load(EBPF_OBJECT)
            .map_err(|source| ProbeError::Load { pid, source })?;
        let target = server.binary.clone();
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).expect("pids are positive"));
        let points = [
            ("command_start", binary.points.command_start),
            ("statement_end", binary.points.statement_end),
            ("error_raised", binary.points.error_raised),
        ];
        for (program, symbol) in points {
            let prog: &mut UProbe = ebpf
                .program_mut(program)
                .ok_or_else(|| ProbeError::Map { map: program, detail: "program not in object".into() })?
                .try_into()
                .map_err(|source| ProbeError::Program { pid, program, source })?;
            prog.load().map_err(|source| ProbeError::Program { pid, program, source })?;
            prog.attach([symbol], &target, scope).map_err(|source| ProbeError::Attach {
                pid,
                program,
                symbol,
                binary: target.display().to_string(),
                source,
            })?;
        }
        let events = ebpf
            .take_map("EVENTS")
            .ok_or_else(|| ProbeError::Map { map: "EVENTS", detail: "not in object".into() })?;
        let events = RingBuf::try_from(events).map_err(|e| ProbeError::Map { map: "EVENTS", detail: e.to_string() })?;
        Ok(Self { server, binary, events, ebpf })
    }

    /// Moves every record waiting in the ring buffer into `out`; returns
    /// how many records could not be decoded.
    pub fn drain(&mut self, out: &mut Vec<Statement>) -> u64 {
        let mut bad = 0;
        while let Some(record) = self.events.next() {
            match decode_statement(&record) {
                Some(statement) => out.push(statement),
                None => bad += 1,
            }
        }
        bad
    }

    pub fn counters(&self) -> Result<Counters, ProbeError> {
        let commands = sum_per_cpu(&self.ebpf, "COMMANDS", COMMAND_SLOTS)?;
        let stats = sum_per_cpu(&self.ebpf, "STATS", stat::SLOTS)?;
        Ok(Counters::from_stats(commands, &stats))
    }
}

fn sum_per_cpu(ebpf: &Ebpf, name: &'static str, slots: u32) -> Result<Vec<u64>, ProbeError> {
    let map = ebpf.map(name).ok_or_else(|| ProbeError::Map { map: name, detail: "not in object".into() })?;
    let array = PerCpuArray::<_, u64>::try_from(map).map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })?;
    (0..slots)
        .map(|i| {
            array
                .get(&i, 0)
                .map(|values| values.iter().sum())
                .map_err(|e| ProbeError::Map { map: name, detail: e.to_string() })
        })
        .collect()
}
