//! The daemon's configuration: a TOML file (`doorbell serve --config FILE`) over the same
//! defaults as the embedded system.
//!
//! Keys are read one by one, so an unknown key or a value of the wrong type or range is
//! refused with the file, the key and the value named ([`ConfigError`]), never ignored.
//!
//! ```toml
//! engines = ["compute", "copy"]   # engine kinds, in id order
//! hw_slots = 8                    # hardware queue slots per engine
//! doorbell_pages = 64             # doorbell BAR pages (one per process, plus the kernel's)
//! doorbell_model = "dedicated"    # or "global"
//! doorbell_pool = 16              # virtualize dedicated doorbells over this many (absent: none)
//! aggregated_doorbell = false     # engines miss unmapped queues' doorbells (amdgpu)
//! idle_period_ms = 20             # engine idle time before F1
//! process_quantum_ms = 10
//! gang_quantum_ms = 1
//! d3_idle_ms = 1000               # device to D3 once every engine idled this long (absent: never)
//! user_queue_mode = "both"        # "kernel-only", "both", "user-only"
//! notify_on_submit = false        # doorbells report ConnectedNotify
//! compute_preemption = "shader"   # none, dma_buffer, dispatch, thread_group, thread, shader
//! copy_preemption = "chunk"       # none, dma_buffer, chunk
//! tdr_delay_ms = 2000             # TdrDelay
//! tdr_limit_count = 5             # TdrLimitCount
//! tdr_limit_time_ms = 60000       # TdrLimitTime
//! tdr_engine_reset = true         # engine resets (else adapter resets)
//! hang_timeout_ms = 2000          # amdgpu's per-queue hang timer, compute and copy
//!
//! [limits]                        # per client process
//! allocations = 4096
//! bytes = 1073741824
//! queues = 256
//! clients = 64                    # client processes at once
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use abi::EngineKind;
use abi::doorbell::DoorbellModel;
use abi::port::UserQueueMode;
use abi::preempt::{ComputeGranularity, CopyGranularity};
use kernel::{SystemConfig, TdrConfig};
use wire::Limits;

/// A refused configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {why}")]
    Read {
        /// The file.
        file: PathBuf,
        /// The OS error.
        why: String,
    },
    /// The file is not TOML.
    #[error("{file}: not valid TOML: {why}")]
    Syntax {
        /// The file.
        file: PathBuf,
        /// The parser's message.
        why: String,
    },
    /// A key the daemon does not know.
    #[error("{file}: unknown key `{key}` (= {value})")]
    UnknownKey {
        /// The file.
        file: PathBuf,
        /// The key (dotted for a table's key).
        key: String,
        /// Its value as written.
        value: String,
    },
    /// A known key with a value it cannot take.
    #[error("{file}: `{key}` = {value}: {expected}")]
    BadValue {
        /// The file.
        file: PathBuf,
        /// The key.
        key: String,
        /// Its value as written.
        value: String,
        /// What it may be.
        expected: String,
    },
}

/// Everything the daemon is configured with.
#[derive(Clone, Debug, Default)]
pub struct DaemonConfig {
    /// The system it hosts.
    pub system: SystemConfig,
    /// Per-process limits.
    pub limits: Limits,
    /// Client processes at once.
    pub max_clients: usize,
}

impl DaemonConfig {
    /// The embedded system's defaults, with the default limits.
    pub fn new() -> DaemonConfig {
        DaemonConfig { system: SystemConfig::default(), limits: Limits::default(), max_clients: 64 }
    }

    /// Reads `file`.
    pub fn load(file: &Path) -> Result<DaemonConfig, ConfigError> {
        let text = std::fs::read_to_string(file)
            .map_err(|e| ConfigError::Read { file: file.to_owned(), why: e.to_string() })?;
        Self::parse(file, &text)
    }

    /// Parses `text` (named `file` in errors).
    pub fn parse(file: &Path, text: &str) -> Result<DaemonConfig, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax { file: file.to_owned(), why: e.to_string() })?;
        let mut cfg = DaemonConfig::new();
        let bad = |key: &str, value: &toml::Value, expected: &str| ConfigError::BadValue {
            file: file.to_owned(),
            key: key.to_owned(),
            value: value.to_string(),
            expected: expected.to_owned(),
        };
        let int = |key: &str, v: &toml::Value, lo: i64, hi: i64| -> Result<i64, ConfigError> {
            match v.as_integer() {
                Some(n) if (lo..=hi).contains(&n) => Ok(n),
                _ => Err(bad(key, v, &format!("an integer from {lo} to {hi}"))),
            }
        };
        let boolean = |key: &str, v: &toml::Value| v.as_bool().ok_or_else(|| bad(key, v, "true or false"));
        let ms = |key: &str, v: &toml::Value, lo: i64| -> Result<Duration, ConfigError> {
            Ok(Duration::from_millis(int(key, v, lo, 86_400_000)? as u64))
        };
        // TDR timeouts: from 1 ms to the kernel's bound.
        let tdr_ms = |key: &str, v: &toml::Value| -> Result<Duration, ConfigError> {
            Ok(Duration::from_millis(int(key, v, 1, TdrConfig::MAX.as_millis() as i64)? as u64))
        };
        let gpu = &mut cfg.system.gpu;
        for (key, v) in &table {
            match key.as_str() {
                "engines" => {
                    let list = v.as_array().filter(|a| !a.is_empty() && a.len() <= 64);
                    let list = list.ok_or_else(|| bad(key, v, "a list of 1 to 64 of \"compute\", \"copy\""))?;
                    gpu.engines = list
                        .iter()
                        .map(|e| match e.as_str() {
                            Some("compute") => Ok(EngineKind::Compute),
                            Some("copy") => Ok(EngineKind::Copy),
                            _ => Err(bad(key, e, "\"compute\" or \"copy\"")),
                        })
                        .collect::<Result<_, _>>()?;
                }
                "hw_slots" => gpu.hw_slots = int(key, v, 1, 64)? as u32,
                "doorbell_pages" => gpu.doorbell_pages = int(key, v, 2, 4096)? as u32,
                "doorbell_model" => {
                    gpu.doorbell_model = match v.as_str() {
                        Some("dedicated") => DoorbellModel::Dedicated,
                        Some("global") => DoorbellModel::Global,
                        _ => return Err(bad(key, v, "\"dedicated\" or \"global\"")),
                    }
                }
                "doorbell_pool" => cfg.system.doorbell_pool = Some(int(key, v, 1, 1 << 20)? as u32),
                "aggregated_doorbell" => gpu.misses_unmapped_doorbells = boolean(key, v)?,
                "idle_period_ms" => gpu.idle_period = ms(key, v, 1)?,
                "process_quantum_ms" => gpu.process_quantum = ms(key, v, 1)?,
                "gang_quantum_ms" => gpu.gang_quantum = ms(key, v, 1)?,
                "d3_idle_ms" => cfg.system.d3_idle = Some(ms(key, v, 1)?),
                "user_queue_mode" => {
                    cfg.system.user_queue_mode = match v.as_str() {
                        Some("kernel-only") => UserQueueMode::KernelOnly,
                        Some("both") => UserQueueMode::Both,
                        Some("user-only") => UserQueueMode::UserOnly,
                        _ => return Err(bad(key, v, "\"kernel-only\", \"both\" or \"user-only\"")),
                    }
                }
                "notify_on_submit" => cfg.system.notify_on_submit = boolean(key, v)?,
                "compute_preemption" => {
                    gpu.preemption.compute = match v.as_str() {
                        Some("none") => ComputeGranularity::None,
                        Some("dma_buffer") => ComputeGranularity::DmaBuffer,
                        Some("dispatch") => ComputeGranularity::Dispatch,
                        Some("thread_group") => ComputeGranularity::ThreadGroup,
                        Some("thread") => ComputeGranularity::Thread,
                        Some("shader") => ComputeGranularity::Shader,
                        _ => {
                            return Err(bad(
                                key,
                                v,
                                "\"none\", \"dma_buffer\", \"dispatch\", \"thread_group\", \"thread\" or \"shader\"",
                            ));
                        }
                    }
                }
                "copy_preemption" => {
                    gpu.preemption.copy = match v.as_str() {
                        Some("none") => CopyGranularity::None,
                        Some("dma_buffer") => CopyGranularity::DmaBuffer,
                        Some("chunk") => CopyGranularity::Chunk,
                        _ => return Err(bad(key, v, "\"none\", \"dma_buffer\" or \"chunk\"")),
                    }
                }
                "tdr_delay_ms" => cfg.system.tdr.delay = tdr_ms(key, v)?,
                "tdr_limit_count" => {
                    cfg.system.tdr.limit_count = int(key, v, 1, TdrConfig::MAX_LIMIT_COUNT as i64)? as u32
                }
                "tdr_limit_time_ms" => cfg.system.tdr.limit_time = tdr_ms(key, v)?,
                "tdr_engine_reset" => cfg.system.tdr.engine_reset = boolean(key, v)?,
                "hang_timeout_ms" => {
                    let d = Some(tdr_ms(key, v)?);
                    (cfg.system.tdr.hang_compute, cfg.system.tdr.hang_copy) = (d, d);
                }
                "limits" => {
                    let t = v.as_table().ok_or_else(|| bad(key, v, "a table"))?;
                    for (k, v) in t {
                        let key = format!("limits.{k}");
                        match k.as_str() {
                            "allocations" => cfg.limits.allocations = int(&key, v, 1, 1 << 20)? as u32,
                            "bytes" => cfg.limits.bytes = int(&key, v, 4096, 1 << 40)? as u64,
                            "queues" => cfg.limits.queues = int(&key, v, 1, 1 << 16)? as u32,
                            "clients" => cfg.max_clients = int(&key, v, 1, 4096)? as usize,
                            _ => {
                                return Err(ConfigError::UnknownKey {
                                    file: file.to_owned(),
                                    key,
                                    value: v.to_string(),
                                });
                            }
                        }
                    }
                }
                _ => {
                    return Err(ConfigError::UnknownKey {
                        file: file.to_owned(),
                        key: key.clone(),
                        value: v.to_string(),
                    });
                }
            }
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_every_key() {
        let f = Path::new("d.toml");
        let c = DaemonConfig::parse(f, "").unwrap();
        assert_eq!(c.system.gpu.engines, SystemConfig::default().gpu.engines);
        let c = DaemonConfig::parse(
            f,
            "engines = [\"copy\"]\nhw_slots = 2\ndoorbell_pool = 4\nidle_period_ms = 5\nuser_queue_mode = \"user-only\"\n[limits]\nqueues = 3\nclients = 2\n",
        )
        .unwrap();
        assert_eq!(c.system.gpu.engines, vec![EngineKind::Copy]);
        assert_eq!(c.system.gpu.hw_slots, 2);
        assert_eq!(c.system.doorbell_pool, Some(4));
        assert_eq!(c.system.gpu.idle_period, Duration::from_millis(5));
        assert_eq!(c.system.user_queue_mode, UserQueueMode::UserOnly);
        assert_eq!((c.limits.queues, c.max_clients), (3, 2));
        let c = DaemonConfig::parse(
            f,
            "compute_preemption = \"dispatch\"\ncopy_preemption = \"none\"\ntdr_delay_ms = 500\ntdr_limit_count = 2\nhang_timeout_ms = 100\n",
        )
        .unwrap();
        assert_eq!(c.system.gpu.preemption.compute, ComputeGranularity::Dispatch);
        assert_eq!(c.system.gpu.preemption.copy, CopyGranularity::None);
        assert_eq!(c.system.tdr.delay, Duration::from_millis(500));
        assert_eq!(c.system.tdr.limit_count, 2);
        assert_eq!(c.system.tdr.hang_copy, Some(Duration::from_millis(100)));
        let e = DaemonConfig::parse(f, "compute_preemption = \"wave\"").unwrap_err();
        assert!(e.to_string().contains("`compute_preemption` = \"wave\""), "{e}");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_file_key_and_value() {
        let f = Path::new("/etc/d.toml");
        let e = DaemonConfig::parse(f, "hw_slot = 3").unwrap_err();
        assert_eq!(e.to_string(), "/etc/d.toml: unknown key `hw_slot` (= 3)");
        let e = DaemonConfig::parse(f, "hw_slots = 0").unwrap_err();
        assert_eq!(e.to_string(), "/etc/d.toml: `hw_slots` = 0: an integer from 1 to 64");
        let e = DaemonConfig::parse(f, "doorbell_model = \"shared\"").unwrap_err();
        assert!(e.to_string().contains("`doorbell_model` = \"shared\""), "{e}");
        let e = DaemonConfig::parse(f, "[limits]\nqueues = -1").unwrap_err();
        assert!(e.to_string().contains("`limits.queues` = -1"), "{e}");
        // Zero or absurd timeouts, refused naming the key and the value.
        for (text, key) in [
            ("tdr_delay_ms = 0", "`tdr_delay_ms` = 0"),
            ("tdr_delay_ms = 86400000", "`tdr_delay_ms` = 86400000"),
            ("tdr_limit_time_ms = 0", "`tdr_limit_time_ms` = 0"),
            ("hang_timeout_ms = 0", "`hang_timeout_ms` = 0"),
            ("hang_timeout_ms = 3600001", "`hang_timeout_ms` = 3600001"),
            ("tdr_limit_count = 0", "`tdr_limit_count` = 0"),
        ] {
            let e = DaemonConfig::parse(f, text).unwrap_err();
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
        let e = DaemonConfig::parse(f, "[limits]\nfoo = 1").unwrap_err();
        assert!(e.to_string().contains("unknown key `limits.foo`"), "{e}");
        assert!(matches!(DaemonConfig::parse(f, "x = ").unwrap_err(), ConfigError::Syntax { .. }));
    }
}
