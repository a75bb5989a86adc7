//! Devices: opened embedded (the kernel and the virtual GPU in this process, on the live
//! driver) or as a client of a doorbell daemon; and contexts on their engines.

use std::sync::Arc;
use std::time::Duration;

use abi::EngineKind;

use crate::error::{Error, guard};
use crate::ptr::{Out, arg, destroy, new_handle, opt_arg, opt_path, slice};

/// A device opened by this process. Every object made from it (buffers, contexts, queues,
/// fences) keeps what it needs of the device alive, so it may be destroyed before or after
/// them.
pub struct db_device {
    pub(crate) device: umd::Device,
    /// The embedded system, when the device is one (held for the device's life; its threads
    /// stop once the device and every object made from it are destroyed).
    _system: Option<kernel::System>,
}

/// An engine kind (`db_context_create`, `db_device_config::engines`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum db_engine_kind {
    /// A compute engine: runs every packet, `DISPATCH` included.
    DB_ENGINE_COMPUTE = 0,
    /// A copy (DMA) engine.
    DB_ENGINE_COPY = 1,
    /// A video engine: kernel-mode queues only.
    DB_ENGINE_VIDEO = 2,
}

/// Decodes an engine kind argument.
pub(crate) fn engine_kind(v: u32, field: impl Into<String>) -> Result<EngineKind, Error> {
    Ok(match v {
        0 => EngineKind::Compute,
        1 => EngineKind::Copy,
        2 => EngineKind::Video,
        _ => {
            return Err(Error::invalid(
                field,
                v,
                "a db_engine_kind: DB_ENGINE_COMPUTE (0), DB_ENGINE_COPY (1) or DB_ENGINE_VIDEO (2)",
            ));
        }
    })
}

/// How to build an embedded device. All zeros (`db_device_config cfg = {0};`) means the
/// defaults of the live driver: a compute and a copy engine, 8 hardware queue slots per
/// engine, 20 ms idle period.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct db_device_config {
    /// The engines' kinds (`db_engine_kind` values), in engine id order; NULL with
    /// `engine_count` 0 for the default (compute, copy).
    pub engines: *const u32,
    /// How many `engines` holds.
    pub engine_count: u32,
    /// Hardware queue slots per engine; 0 for the default (8).
    pub hw_slots: u32,
    /// How long an engine idles before it enters F1 and its doorbells disconnect (the next
    /// submission then reads `DB_DOORBELL_DISCONNECTED_RETRY` and reconnects); 0 for the
    /// default (20 ms).
    pub idle_period_ms: u32,
}

/// Opens an embedded device: the kernel and the virtual GPU run in this process (the live
/// driver: a firmware thread and a kernel scheduler thread, started here).
///
/// `config`: NULL for the defaults (see `db_device_config`). A value out of range is refused
/// with `DB_INVALID_ARGUMENT`, naming the field and value. On success `*out_device` is a new
/// handle, to be destroyed with `db_device_destroy`.
///
/// # Safety
///
/// `config` is NULL or points to a readable `db_device_config` whose `engines` is NULL or
/// points to `engine_count` readable values; `out_device` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_device_open_embedded(
    config: *const db_device_config,
    out_device: *mut *mut db_device,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (config, out) = unsafe { (opt_arg(config), Out::new(out_device, "out_device")?) };
        let mut gpu = gpu::GpuConfig::default();
        if let Some(c) = config {
            // SAFETY: the function's contract: `engines` holds `engine_count` values.
            let kinds = unsafe { slice(c.engines, c.engine_count as usize, "config->engines")? };
            if !kinds.is_empty() {
                gpu.engines = kinds
                    .iter()
                    .enumerate()
                    .map(|(i, &k)| engine_kind(k, format!("config->engines[{i}]")))
                    .collect::<Result<_, _>>()?;
            }
            if c.hw_slots != 0 {
                gpu.hw_slots = c.hw_slots;
            }
            if c.idle_period_ms != 0 {
                gpu.idle_period = Duration::from_millis(c.idle_period_ms.into());
            }
        }
        let system = kernel::System::live(kernel::SystemConfig { gpu, ..kernel::SystemConfig::default() })?;
        let device = umd::Device::open(system.open_process()?)?;
        out.set(new_handle(db_device { device, _system: Some(system) }));
        Ok(())
    })
}

/// Opens a device as a new client process of the doorbell daemon (`doorbell serve`)
/// listening on the Unix socket `socket_path`; NULL for `$DOORBELL_SOCKET`, else the daemon's
/// default socket (`$XDG_RUNTIME_DIR/doorbell/doorbell.sock`, else
/// `/tmp/doorbell-$UID/doorbell.sock`). `DB_CONNECT` if no daemon answers there or it refuses
/// the client (another protocol version, too many clients). On success `*out_device` is a new
/// handle, to be destroyed with `db_device_destroy`.
///
/// # Safety
///
/// `socket_path` is NULL or a NUL-terminated string; `out_device` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_device_connect(
    socket_path: *const std::ffi::c_char,
    out_device: *mut *mut db_device,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (path, out) = unsafe { (opt_path(socket_path), Out::new(out_device, "out_device")?) };
        let port = match path {
            Some(p) => wire::client::connect(p)?,
            None => wire::client::connect_default()?,
        };
        let device = umd::Device::open(port)?;
        out.set(new_handle(db_device { device, _system: None }));
        Ok(())
    })
}

/// Destroys a device handle; NULL is a no-op. Objects made from it stay usable until they are
/// destroyed themselves: the device is closed with the last of them. An embedded device's
/// threads stop then.
///
/// # Safety
///
/// `device` is NULL or a live device handle that no other thread is using; it must not be
/// used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_device_destroy(device: *mut db_device) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        unsafe { destroy(device) };
        Ok(())
    })
}

/// A hardware context on one engine of a device: what queues are created on.
pub struct db_context {
    pub(crate) context: Arc<umd::Context>,
}

/// Creates a context on the device's first engine of `engine_kind` (a `db_engine_kind`).
/// `DB_NO_ENGINE` if the device has none. On success `*out_context` is a new handle, to be
/// destroyed with `db_context_destroy`.
///
/// # Safety
///
/// `device` is NULL or a live device handle; `out_context` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_context_create(
    device: *const db_device,
    engine_kind: u32,
    out_context: *mut *mut db_context,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (d, out) = unsafe { (arg(device, "device")?, Out::new(out_context, "out_context")?) };
        let kind = self::engine_kind(engine_kind, "engine_kind")?;
        let context = d.device.create_context(d.device.engine(kind)?)?;
        out.set(new_handle(db_context { context: Arc::new(context) }));
        Ok(())
    })
}

/// Destroys a context handle; NULL is a no-op. Queues created on it keep the context alive:
/// the kernel's context goes with the last of them.
///
/// # Safety
///
/// `context` is NULL or a live context handle that no other thread is using; it must not be
/// used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_context_destroy(context: *mut db_context) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        unsafe { destroy(context) };
        Ok(())
    })
}
