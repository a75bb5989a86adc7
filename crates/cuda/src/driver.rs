//! # driver — the CUDA driver API and NVRTC, loaded at run time
//!
//! This is the one module of the crate that calls CUDA through `unsafe` FFI. Everything above
//! it (the engine program's host side, the baseline benchmarks) uses the safe types here:
//! [`Cuda`] (one device's primary context), [`Module`] and [`Function`] (loaded GPU code),
//! [`Stream`], [`PinnedBuffer`] (host memory the GPU reads and writes over PCIe),
//! [`Registration`] (an existing host range, such as a memfd `MAP_SHARED` mapping, made
//! visible to the GPU), [`DeviceBuffer`], [`Graph`]/[`GraphExec`], and [`Nvrtc`], CUDA's
//! run-time compiler, which turns `device/*.cu` into GPU code.
//!
//! ## Why dynamic loading
//!
//! The workspace must build and pass its tests on machines with no GPU and no CUDA toolkit
//! (the development machines and CI have neither). So nothing here links against CUDA: the
//! driver library (`libcuda.so.1`, which comes with the NVIDIA kernel driver) and NVRTC
//! (`libnvrtc.so.*`, which comes with the toolkit or the `nvidia-cuda-nvrtc` Python wheel) are
//! opened with `dlopen` when first needed, and every entry point returns a typed
//! [`CudaError`] (never a panic) when they or a device are missing. NVRTC needs no GPU: it
//! compiles on the CPU, so [`Nvrtc`] is usable, and tested, without one.
//!
//! Where a library is looked for: `libcuda` at `$DOORBELL_LIBCUDA` first, then by the names
//! `libcuda.so.1` and `libcuda.so` (the dynamic loader's search) and a few fixed paths;
//! NVRTC at `$DOORBELL_NVRTC` first, then by name, then in `/usr/local/cuda*/lib64` and in
//! the `nvidia/*/lib/` folders of Python `site-packages` (where the `nvidia-cuda-nvrtc` wheel
//! puts it). Every path tried is recorded in the error. The first library that loads with
//! every symbol this module needs is kept for the life of the process and never unloaded: the
//! driver owns threads and exit handlers that must not outlive its code, and an NVRTC load
//! costs tens of milliseconds. A failed search is not remembered, so a later call searches
//! again (and sees a changed environment).
//!
//! Several driver functions are exported under versioned names (`cuMemAlloc_v2`,
//! `cuStreamDestroy_v2`, `cuMemHostRegister_v2`, ...): `cuda.h` maps the plain names to them
//! with `#define`, and the unversioned symbols that still exist are the old ABI (32-bit sizes,
//! for some). Each symbol below is the one `cuda.h` (CUDA 13) selects, named beside its field.
//!
//! ## Invariants
//!
//! - A CUDA context is bound to the *calling thread*. Every method that calls the driver
//!   first makes this [`Cuda`]'s context current on the calling thread (`cuCtxSetCurrent`, a
//!   few tens of nanoseconds), so any thread may use any of these values.
//! - Every resource is freed on drop, after binding the context. Each resource holds a clone
//!   of its [`Cuda`], so the device's primary context (retained by [`Cuda::open`]) is released
//!   only after the last resource made in it is gone.
//! - Kernel arguments are checked against the kernel's own parameter list
//!   (`cuFuncGetParamInfo`) before a launch, so a launch never makes the driver read past the
//!   arguments the host supplied.

use std::ffi::{CStr, CString, c_char, c_void};
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use libloading::Library;

/// What went wrong in a call to CUDA. Each variant names the call, library or input at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No usable driver library (`libcuda`) was found: no NVIDIA driver is installed here.
    #[error("no NVIDIA GPU driver found (libcuda): tried {}: {why}", tried.join(", "))]
    NoDriver {
        /// Every path or library name tried, in order.
        tried: Vec<String>,
        /// Why each failed (the loader's message, or the symbol missing).
        why: String,
    },
    /// The driver loaded but reports no CUDA device.
    #[error("the driver found no CUDA device")]
    NoDevice,
    /// No usable NVRTC (CUDA's run-time compiler, `libnvrtc`) was found.
    #[error("no NVRTC (CUDA's run-time compiler, libnvrtc) found: tried {}: {why}", tried.join(", "))]
    NoNvrtc {
        /// Every path or library name tried, in order.
        tried: Vec<String>,
        /// Why each failed.
        why: String,
    },
    /// A driver call returned an error.
    #[error("{call} failed: {name} (CUresult {code})")]
    Call {
        /// The driver function, as `cuda.h` names it.
        call: &'static str,
        /// The `CUresult` it returned.
        code: i32,
        /// The code's name (from `cuGetErrorName`), or "unknown error".
        name: String,
    },
    /// NVRTC rejected the program; `log` is its compile log.
    #[error("NVRTC could not compile {program}:\n{log}")]
    Compile {
        /// The program's name, as given to [`Nvrtc::compile`].
        program: String,
        /// NVRTC's program log (the compiler's diagnostics).
        log: String,
    },
    /// An NVRTC call other than the compilation itself failed.
    #[error("{call} failed: {what} (nvrtcResult {code})")]
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// The `nvrtcResult` it returned.
        code: i32,
        /// Its description (from `nvrtcGetErrorString`).
        what: String,
    },
    /// The driver or device lacks something this crate needs.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is missing.
        what: String,
    },
    /// An argument was refused before reaching CUDA (out of range, misaligned, mismatched).
    #[error("bad input: {what}")]
    BadInput {
        /// The argument and why it was refused.
        what: String,
    },
    /// A wait on the GPU did not end in time.
    #[error("timed out after {after_ms} ms waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the wait lasted.
        after_ms: u64,
    },
}

// ---------------------------------------------------------------------------------------
// Raw types and constants (cuda.h, CUDA 13)
// ---------------------------------------------------------------------------------------

/// `CUresult`: an `int`-sized enum; 0 is `CUDA_SUCCESS`.
type CuResult = i32;
/// `CUdevice`: an `int` ordinal handle.
type CuDevice = i32;
/// `CUdeviceptr`: a 64-bit device address.
type CuDevicePtr = u64;
/// Any opaque handle (`CUcontext`, `CUmodule`, `CUfunction`, `CUstream`, `CUgraph`,
/// `CUgraphExec`, `nvrtcProgram`): a pointer to an incomplete struct.
type Handle = *mut c_void;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;
const CUDA_ERROR_NOT_READY: CuResult = 600;

const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: i32 = 16;
const CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: i32 = 19;
const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: i32 = 41;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: i32 = 75;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: i32 = 76;
const CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: i32 = 86;

const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: i32 = 0;
const CU_FUNC_ATTRIBUTE_NUM_REGS: i32 = 4;
const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;

const CU_STREAM_NON_BLOCKING: u32 = 0x1;
const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: i32 = 1;

const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x01;
const CU_MEMHOSTALLOC_DEVICEMAP: u32 = 0x02;
const CU_MEMHOSTREGISTER_PORTABLE: u32 = 0x01;
const CU_MEMHOSTREGISTER_DEVICEMAP: u32 = 0x02;

/// The legacy default stream (`CUstream` 0): used only for the synchronous copies and fills
/// of [`DeviceBuffer`], which wait for it.
const NULL_STREAM: Handle = std::ptr::null_mut();

const NVRTC_SUCCESS: i32 = 0;
const NVRTC_ERROR_COMPILATION: i32 = 6;

/// Host pages [`Registration`] requires alignment to (the smallest x86-64 Linux page).
const HOST_PAGE: usize = 4096;

// ---------------------------------------------------------------------------------------
// The driver library
// ---------------------------------------------------------------------------------------

/// The driver's entry points, loaded once and kept for the process's life.
struct Driver {
    /// The library, kept loaded: every pointer below points into it.
    _lib: Library,
    /// Where it was loaded from.
    path: String,
    cu_init: unsafe extern "C" fn(flags: u32) -> CuResult,
    cu_driver_get_version: unsafe extern "C" fn(version: *mut i32) -> CuResult,
    cu_get_error_name: unsafe extern "C" fn(error: CuResult, name: *mut *const c_char) -> CuResult,
    cu_device_get_count: unsafe extern "C" fn(count: *mut i32) -> CuResult,
    cu_device_get: unsafe extern "C" fn(device: *mut CuDevice, ordinal: i32) -> CuResult,
    cu_device_get_name: unsafe extern "C" fn(name: *mut c_char, len: i32, dev: CuDevice) -> CuResult,
    cu_device_get_attribute: unsafe extern "C" fn(value: *mut i32, attrib: i32, dev: CuDevice) -> CuResult,
    cu_device_primary_ctx_retain: unsafe extern "C" fn(ctx: *mut Handle, dev: CuDevice) -> CuResult,
    /// `cuDevicePrimaryCtxRelease_v2`.
    cu_device_primary_ctx_release: unsafe extern "C" fn(dev: CuDevice) -> CuResult,
    cu_ctx_set_current: unsafe extern "C" fn(ctx: Handle) -> CuResult,
    cu_ctx_get_stream_priority_range: unsafe extern "C" fn(least: *mut i32, greatest: *mut i32) -> CuResult,
    cu_module_load_data: unsafe extern "C" fn(module: *mut Handle, image: *const c_void) -> CuResult,
    cu_module_unload: unsafe extern "C" fn(module: Handle) -> CuResult,
    cu_module_get_function: unsafe extern "C" fn(func: *mut Handle, module: Handle, name: *const c_char) -> CuResult,
    cu_func_get_attribute: unsafe extern "C" fn(value: *mut i32, attrib: i32, func: Handle) -> CuResult,
    cu_func_set_attribute: unsafe extern "C" fn(func: Handle, attrib: i32, value: i32) -> CuResult,
    /// CUDA 12.4 and later; `None` on older drivers (then launches are refused).
    cu_func_get_param_info:
        Option<unsafe extern "C" fn(func: Handle, index: usize, offset: *mut usize, size: *mut usize) -> CuResult>,
    cu_stream_create_with_priority: unsafe extern "C" fn(stream: *mut Handle, flags: u32, priority: i32) -> CuResult,
    /// `cuStreamDestroy_v2`.
    cu_stream_destroy: unsafe extern "C" fn(stream: Handle) -> CuResult,
    cu_stream_synchronize: unsafe extern "C" fn(stream: Handle) -> CuResult,
    cu_stream_query: unsafe extern "C" fn(stream: Handle) -> CuResult,
    /// `cuStreamBeginCapture_v2` (mode: `CUstreamCaptureMode`, an `int`-sized enum).
    cu_stream_begin_capture: unsafe extern "C" fn(stream: Handle, mode: i32) -> CuResult,
    cu_stream_end_capture: unsafe extern "C" fn(stream: Handle, graph: *mut Handle) -> CuResult,
    /// `cuGraphInstantiateWithFlags` (what `cuGraphInstantiate` means since CUDA 12).
    cu_graph_instantiate: unsafe extern "C" fn(exec: *mut Handle, graph: Handle, flags: u64) -> CuResult,
    cu_graph_launch: unsafe extern "C" fn(exec: Handle, stream: Handle) -> CuResult,
    cu_graph_destroy: unsafe extern "C" fn(graph: Handle) -> CuResult,
    cu_graph_exec_destroy: unsafe extern "C" fn(exec: Handle) -> CuResult,
    cu_launch_kernel: unsafe extern "C" fn(
        func: Handle,
        grid_x: u32,
        grid_y: u32,
        grid_z: u32,
        block_x: u32,
        block_y: u32,
        block_z: u32,
        shared_bytes: u32,
        stream: Handle,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CuResult,
    cu_mem_host_alloc: unsafe extern "C" fn(ptr: *mut *mut c_void, bytes: usize, flags: u32) -> CuResult,
    cu_mem_free_host: unsafe extern "C" fn(ptr: *mut c_void) -> CuResult,
    /// `cuMemHostGetDevicePointer_v2`.
    cu_mem_host_get_device_pointer:
        unsafe extern "C" fn(dev: *mut CuDevicePtr, host: *mut c_void, flags: u32) -> CuResult,
    /// `cuMemHostRegister_v2`.
    cu_mem_host_register: unsafe extern "C" fn(ptr: *mut c_void, bytes: usize, flags: u32) -> CuResult,
    cu_mem_host_unregister: unsafe extern "C" fn(ptr: *mut c_void) -> CuResult,
    /// `cuMemAlloc_v2`.
    cu_mem_alloc: unsafe extern "C" fn(dev: *mut CuDevicePtr, bytes: usize) -> CuResult,
    /// `cuMemFree_v2`.
    cu_mem_free: unsafe extern "C" fn(dev: CuDevicePtr) -> CuResult,
    /// `cuMemcpyHtoDAsync_v2`.
    cu_memcpy_htod_async:
        unsafe extern "C" fn(dst: CuDevicePtr, src: *const c_void, bytes: usize, stream: Handle) -> CuResult,
    /// `cuMemcpyDtoHAsync_v2`.
    cu_memcpy_dtoh_async:
        unsafe extern "C" fn(dst: *mut c_void, src: CuDevicePtr, bytes: usize, stream: Handle) -> CuResult,
    /// `cuMemsetD8Async` (no versioned name).
    cu_memset_d8_async: unsafe extern "C" fn(dst: CuDevicePtr, value: u8, count: usize, stream: Handle) -> CuResult,
}

/// Looks up `name` (NUL-terminated) in `lib` as a value of type `T`, a function pointer type.
///
/// # Safety
/// `T` must be the symbol's true type (the C signature `cuda.h` or `nvrtc.h` gives it), and
/// the returned pointer must not be used after `lib` is unloaded.
unsafe fn symbol<T: Copy>(lib: &Library, path: &str, name: &str) -> Result<T, String> {
    // SAFETY: the caller guarantees `T` is the symbol's type; the value is copied out of the
    // `Symbol` and its use is bounded by the library's life by the caller.
    let sym = unsafe { lib.get::<T>(name.as_bytes()) };
    sym.map(|s| *s).map_err(|e| format!("{path} lacks {}: {e}", name.trim_end_matches('\0')))
}

impl Driver {
    /// Opens `path` and resolves every entry point.
    fn load(path: &str) -> Result<Driver, String> {
        // SAFETY: loading libcuda runs its initialisers, which have no preconditions on our
        // side; it is the library NVIDIA ships for exactly this use.
        let lib = unsafe { Library::new(path) }.map_err(|e| e.to_string())?; // (dlerror names the path)
        // SAFETY (each `symbol` call): the type on the left of each line is the C signature
        // cuda.h (CUDA 13) declares for the named symbol; the library is stored in the struct
        // beside the pointers and never unloaded while they exist (drivers are leaked).
        unsafe {
            Ok(Driver {
                path: path.to_string(),
                cu_init: symbol(&lib, path, "cuInit\0")?,
                cu_driver_get_version: symbol(&lib, path, "cuDriverGetVersion\0")?,
                cu_get_error_name: symbol(&lib, path, "cuGetErrorName\0")?,
                cu_device_get_count: symbol(&lib, path, "cuDeviceGetCount\0")?,
                cu_device_get: symbol(&lib, path, "cuDeviceGet\0")?,
                cu_device_get_name: symbol(&lib, path, "cuDeviceGetName\0")?,
                cu_device_get_attribute: symbol(&lib, path, "cuDeviceGetAttribute\0")?,
                cu_device_primary_ctx_retain: symbol(&lib, path, "cuDevicePrimaryCtxRetain\0")?,
                cu_device_primary_ctx_release: symbol(&lib, path, "cuDevicePrimaryCtxRelease_v2\0")?,
                cu_ctx_set_current: symbol(&lib, path, "cuCtxSetCurrent\0")?,
                cu_ctx_get_stream_priority_range: symbol(&lib, path, "cuCtxGetStreamPriorityRange\0")?,
                cu_module_load_data: symbol(&lib, path, "cuModuleLoadData\0")?,
                cu_module_unload: symbol(&lib, path, "cuModuleUnload\0")?,
                cu_module_get_function: symbol(&lib, path, "cuModuleGetFunction\0")?,
                cu_func_get_attribute: symbol(&lib, path, "cuFuncGetAttribute\0")?,
                cu_func_set_attribute: symbol(&lib, path, "cuFuncSetAttribute\0")?,
                cu_func_get_param_info: symbol(&lib, path, "cuFuncGetParamInfo\0").ok(),
                cu_stream_create_with_priority: symbol(&lib, path, "cuStreamCreateWithPriority\0")?,
                cu_stream_destroy: symbol(&lib, path, "cuStreamDestroy_v2\0")?,
                cu_stream_synchronize: symbol(&lib, path, "cuStreamSynchronize\0")?,
                cu_stream_query: symbol(&lib, path, "cuStreamQuery\0")?,
                cu_stream_begin_capture: symbol(&lib, path, "cuStreamBeginCapture_v2\0")?,
                cu_stream_end_capture: symbol(&lib, path, "cuStreamEndCapture\0")?,
                cu_graph_instantiate: symbol(&lib, path, "cuGraphInstantiateWithFlags\0")?,
                cu_graph_launch: symbol(&lib, path, "cuGraphLaunch\0")?,
                cu_graph_destroy: symbol(&lib, path, "cuGraphDestroy\0")?,
                cu_graph_exec_destroy: symbol(&lib, path, "cuGraphExecDestroy\0")?,
                cu_launch_kernel: symbol(&lib, path, "cuLaunchKernel\0")?,
                cu_mem_host_alloc: symbol(&lib, path, "cuMemHostAlloc\0")?,
                cu_mem_free_host: symbol(&lib, path, "cuMemFreeHost\0")?,
                cu_mem_host_get_device_pointer: symbol(&lib, path, "cuMemHostGetDevicePointer_v2\0")?,
                cu_mem_host_register: symbol(&lib, path, "cuMemHostRegister_v2\0")?,
                cu_mem_host_unregister: symbol(&lib, path, "cuMemHostUnregister\0")?,
                cu_mem_alloc: symbol(&lib, path, "cuMemAlloc_v2\0")?,
                cu_mem_free: symbol(&lib, path, "cuMemFree_v2\0")?,
                cu_memcpy_htod_async: symbol(&lib, path, "cuMemcpyHtoDAsync_v2\0")?,
                cu_memcpy_dtoh_async: symbol(&lib, path, "cuMemcpyDtoHAsync_v2\0")?,
                cu_memset_d8_async: symbol(&lib, path, "cuMemsetD8Async\0")?,
                _lib: lib,
            })
        }
    }

    /// `Ok` for `CUDA_SUCCESS`, else the error naming `call` and the code.
    fn check(&self, call: &'static str, code: CuResult) -> Result<(), CudaError> {
        if code == CUDA_SUCCESS { Ok(()) } else { Err(self.error(call, code)) }
    }

    /// The error for `call` returning `code`, with the code's name.
    fn error(&self, call: &'static str, code: CuResult) -> CudaError {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: `name` is a valid place for one pointer; cuGetErrorName writes a pointer to
        // a static NUL-terminated string, or leaves it NULL (and fails) for unknown codes.
        let r = unsafe { (self.cu_get_error_name)(code, &mut name) };
        let name = if r == CUDA_SUCCESS && !name.is_null() {
            // SAFETY: non-NULL and pointing to a static NUL-terminated string (see above).
            unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
        } else {
            "unknown error".to_string()
        };
        CudaError::Call { call, code, name }
    }
}

/// The driver library once loaded; failures are not cached (see the module docs).
static DRIVER: OnceLock<&'static Driver> = OnceLock::new();

/// The libraries and paths tried for `libcuda`, in order, given `$DOORBELL_LIBCUDA`.
fn libcuda_candidates(env: Option<String>) -> Vec<String> {
    let mut out: Vec<String> = env.into_iter().filter(|p| !p.is_empty()).collect();
    for name in [
        "libcuda.so.1",
        "libcuda.so",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
    ] {
        push_unique(&mut out, name.to_string());
    }
    out
}

fn push_unique(list: &mut Vec<String>, item: String) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// Tries each candidate in order; the first that loads with every symbol wins (and is leaked,
/// so its entry points stay valid for the process's life).
fn load_driver_from(candidates: &[String]) -> Result<&'static Driver, CudaError> {
    let mut why = Vec::new();
    for path in candidates {
        match Driver::load(path) {
            Ok(d) => return Ok(Box::leak(Box::new(d))),
            Err(e) => why.push(e),
        }
    }
    Err(CudaError::NoDriver { tried: candidates.to_vec(), why: why.join("; ") })
}

/// The process's driver library, loading it on first success.
fn driver() -> Result<&'static Driver, CudaError> {
    if let Some(d) = DRIVER.get() {
        return Ok(d);
    }
    let d = load_driver_from(&libcuda_candidates(std::env::var("DOORBELL_LIBCUDA").ok()))?;
    // Two threads may race here; both drivers stay valid (leaked), one is kept.
    Ok(DRIVER.get_or_init(|| d))
}

// ---------------------------------------------------------------------------------------
// NVRTC
// ---------------------------------------------------------------------------------------

/// NVRTC's entry points (nvrtc.h), loaded once.
struct NvrtcLib {
    _lib: Library,
    path: String,
    version: unsafe extern "C" fn(major: *mut i32, minor: *mut i32) -> i32,
    get_error_string: unsafe extern "C" fn(result: i32) -> *const c_char,
    create_program: unsafe extern "C" fn(
        prog: *mut Handle,
        src: *const c_char,
        name: *const c_char,
        num_headers: i32,
        headers: *const *const c_char,
        include_names: *const *const c_char,
    ) -> i32,
    destroy_program: unsafe extern "C" fn(prog: *mut Handle) -> i32,
    compile_program: unsafe extern "C" fn(prog: Handle, num_options: i32, options: *const *const c_char) -> i32,
    get_ptx_size: unsafe extern "C" fn(prog: Handle, size: *mut usize) -> i32,
    get_ptx: unsafe extern "C" fn(prog: Handle, ptx: *mut c_char) -> i32,
    get_cubin_size: unsafe extern "C" fn(prog: Handle, size: *mut usize) -> i32,
    get_cubin: unsafe extern "C" fn(prog: Handle, cubin: *mut c_char) -> i32,
    get_program_log_size: unsafe extern "C" fn(prog: Handle, size: *mut usize) -> i32,
    get_program_log: unsafe extern "C" fn(prog: Handle, log: *mut c_char) -> i32,
}

impl NvrtcLib {
    fn load(path: &str) -> Result<NvrtcLib, String> {
        // SAFETY: loading libnvrtc runs its initialisers, which have no preconditions.
        let lib = unsafe { Library::new(path) }.map_err(|e| e.to_string())?; // (dlerror names the path)
        // SAFETY (each `symbol` call): the types are nvrtc.h's signatures for the named
        // symbols; the library lives beside the pointers and is never unloaded (leaked).
        unsafe {
            Ok(NvrtcLib {
                path: path.to_string(),
                version: symbol(&lib, path, "nvrtcVersion\0")?,
                get_error_string: symbol(&lib, path, "nvrtcGetErrorString\0")?,
                create_program: symbol(&lib, path, "nvrtcCreateProgram\0")?,
                destroy_program: symbol(&lib, path, "nvrtcDestroyProgram\0")?,
                compile_program: symbol(&lib, path, "nvrtcCompileProgram\0")?,
                get_ptx_size: symbol(&lib, path, "nvrtcGetPTXSize\0")?,
                get_ptx: symbol(&lib, path, "nvrtcGetPTX\0")?,
                get_cubin_size: symbol(&lib, path, "nvrtcGetCUBINSize\0")?,
                get_cubin: symbol(&lib, path, "nvrtcGetCUBIN\0")?,
                get_program_log_size: symbol(&lib, path, "nvrtcGetProgramLogSize\0")?,
                get_program_log: symbol(&lib, path, "nvrtcGetProgramLog\0")?,
                _lib: lib,
            })
        }
    }

    fn check(&self, call: &'static str, code: i32) -> Result<(), CudaError> {
        if code == NVRTC_SUCCESS {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString accepts any value and returns a static NUL-terminated
        // string ("NVRTC_ERROR unknown" for codes it does not know).
        let s = unsafe { (self.get_error_string)(code) };
        let what = if s.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-NULL static NUL-terminated string (see above).
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        Err(CudaError::Nvrtc { call, code, what })
    }
}

static NVRTC: OnceLock<&'static NvrtcLib> = OnceLock::new();

/// Entries of `dir` whose names satisfy `keep`, as full paths, sorted by name descending (so
/// `libnvrtc.so.13` comes before `libnvrtc.so.12`, `python3.12` before `python3.11`).
fn dir_entries(dir: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> =
        rd.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).filter(|n| keep(n)).collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    names.into_iter().map(|n| format!("{}/{n}", dir.trim_end_matches('/'))).collect()
}

/// `libnvrtc.so*` files in `dir` (not `libnvrtc-builtins`, which is NVRTC's own helper).
fn nvrtc_files_in(dir: &str) -> Vec<String> {
    dir_entries(dir, |n| n.starts_with("libnvrtc.so"))
}

/// Python package folders (`site-packages`, `dist-packages`) where pip puts NVIDIA's wheels.
fn python_package_dirs() -> Vec<String> {
    let mut roots = Vec::new();
    if let Ok(venv) = std::env::var("VIRTUAL_ENV") {
        roots.extend(dir_entries(&format!("{venv}/lib"), |n| n.starts_with("python3")));
    }
    for base in ["/usr/lib", "/usr/local/lib", "/usr/lib64"] {
        roots.extend(dir_entries(base, |n| n.starts_with("python3")));
    }
    for opt in dir_entries("/opt", |_| true) {
        for venv in [format!("{opt}/.venv/lib"), format!("{opt}/venv/lib"), format!("{opt}/lib")] {
            roots.extend(dir_entries(&venv, |n| n.starts_with("python3")));
        }
    }
    let mut out = Vec::new();
    for root in roots {
        for sub in ["site-packages", "dist-packages"] {
            let d = format!("{root}/{sub}");
            if std::path::Path::new(&d).is_dir() {
                push_unique(&mut out, d);
            }
        }
    }
    out
}

/// The libraries and paths tried for NVRTC, in order, given `$DOORBELL_NVRTC`.
fn nvrtc_candidates(env: Option<String>) -> Vec<String> {
    let mut out: Vec<String> = env.into_iter().filter(|p| !p.is_empty()).collect();
    for name in [
        "libnvrtc.so",
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "/usr/local/cuda/lib64/libnvrtc.so",
        "/usr/local/cuda/lib64/libnvrtc.so.13",
        "/usr/local/cuda/lib64/libnvrtc.so.12",
    ] {
        push_unique(&mut out, name.to_string());
    }
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(home) = std::env::var(var) {
            dirs.push(format!("{home}/lib64"));
        }
    }
    dirs.extend(dir_entries("/usr/local", |n| n.starts_with("cuda")).into_iter().map(|d| format!("{d}/lib64")));
    for site in python_package_dirs() {
        dirs.extend(dir_entries(&format!("{site}/nvidia"), |_| true).into_iter().map(|d| format!("{d}/lib")));
    }
    for d in dirs {
        for f in nvrtc_files_in(&d) {
            push_unique(&mut out, f);
        }
    }
    out
}

/// CUDA's run-time compiler, NVRTC. Needs no GPU.
///
/// Cheap to copy: the library is loaded once per process and kept.
#[derive(Clone, Copy)]
pub struct Nvrtc {
    lib: &'static NvrtcLib,
}

impl fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvrtc").field("path", &self.lib.path).finish()
    }
}

/// An NVRTC program, destroyed on drop.
struct Program<'a> {
    lib: &'a NvrtcLib,
    prog: Handle,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from nvrtcCreateProgram and is destroyed once, here.
        unsafe { (self.lib.destroy_program)(&mut self.prog) };
    }
}

impl Program<'_> {
    /// Reads an output of the program through a (size, copy) pair of NVRTC calls.
    fn output(
        &self,
        calls: (&'static str, &'static str),
        size_fn: unsafe extern "C" fn(Handle, *mut usize) -> i32,
        get_fn: unsafe extern "C" fn(Handle, *mut c_char) -> i32,
    ) -> Result<Vec<u8>, CudaError> {
        let mut size = 0usize;
        // SAFETY: `prog` is a live program; `size` is a valid place for one size_t.
        self.lib.check(calls.0, unsafe { size_fn(self.prog, &mut size) })?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` holds exactly the `size` bytes NVRTC said it will write.
            self.lib.check(calls.1, unsafe { get_fn(self.prog, buf.as_mut_ptr().cast()) })?;
        }
        Ok(buf)
    }

    fn log(&self) -> String {
        match self.output(
            ("nvrtcGetProgramLogSize", "nvrtcGetProgramLog"),
            self.lib.get_program_log_size,
            self.lib.get_program_log,
        ) {
            Ok(mut bytes) => {
                while bytes.last() == Some(&0) {
                    bytes.pop();
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Err(e) => format!("(no log: {e})"),
        }
    }
}

fn cstring(what: &str, s: &str) -> Result<CString, CudaError> {
    CString::new(s).map_err(|_| CudaError::BadInput { what: format!("{what} contains a NUL byte") })
}

impl Nvrtc {
    /// Loads NVRTC (see the module docs for where it is looked for).
    pub fn load() -> Result<Nvrtc, CudaError> {
        if let Some(lib) = NVRTC.get() {
            return Ok(Nvrtc { lib });
        }
        let candidates = nvrtc_candidates(std::env::var("DOORBELL_NVRTC").ok());
        let mut why = Vec::new();
        for path in &candidates {
            match NvrtcLib::load(path) {
                Ok(lib) => {
                    let lib: &'static NvrtcLib = Box::leak(Box::new(lib));
                    return Ok(Nvrtc { lib: NVRTC.get_or_init(|| lib) });
                }
                Err(e) => why.push(e),
            }
        }
        Err(CudaError::NoNvrtc { tried: candidates, why: why.join("; ") })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &str {
        &self.lib.path
    }

    /// NVRTC's version, (major, minor): (13, 0) for CUDA 13.0. (0, 0) if it cannot say.
    pub fn version(&self) -> (i32, i32) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both are valid places for one int.
        let r = unsafe { (self.lib.version)(&mut major, &mut minor) };
        if r == NVRTC_SUCCESS { (major, minor) } else { (0, 0) }
    }

    /// Compiles CUDA C++ `source` (named `name` in diagnostics) and returns PTX.
    ///
    /// `headers` are (include name, contents) pairs: `#include "common.cuh"` finds the pair
    /// named `common.cuh` (NVRTC has no file system and no standard headers). `options` are
    /// NVRTC's (`--gpu-architecture=compute_90`, `-default-device`, ...); for PTX name a
    /// virtual architecture (`compute_XY`). The PTX is returned as NVRTC gives it, **with its
    /// terminating NUL byte**, ready for [`Cuda::load_module`] (which also accepts it
    /// without). A rejected program gives [`CudaError::Compile`] with NVRTC's log.
    pub fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[&str],
    ) -> Result<Vec<u8>, CudaError> {
        let prog = self.build(name, source, headers, options)?;
        prog.output(("nvrtcGetPTXSize", "nvrtcGetPTX"), self.lib.get_ptx_size, self.lib.get_ptx)
    }

    /// Like [`compile`](Self::compile), but returns a CUBIN (an ELF image of machine code);
    /// `options` must name a real architecture (`--gpu-architecture=sm_90`). A CUBIN needs no
    /// JIT compilation by the driver, so it loads on a driver older than this NVRTC (of the
    /// same major version), where PTX from a newer NVRTC would be refused.
    pub fn compile_cubin(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[&str],
    ) -> Result<Vec<u8>, CudaError> {
        let prog = self.build(name, source, headers, options)?;
        prog.output(("nvrtcGetCUBINSize", "nvrtcGetCUBIN"), self.lib.get_cubin_size, self.lib.get_cubin)
    }

    /// Creates and compiles the program.
    fn build(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[&str],
    ) -> Result<Program<'static>, CudaError> {
        let src = cstring("the source", source)?;
        let cname = cstring("the program name", name)?;
        let mut header_names = Vec::with_capacity(headers.len());
        let mut header_texts = Vec::with_capacity(headers.len());
        for (n, text) in headers {
            header_names.push(cstring("a header name", n)?);
            header_texts.push(cstring(&format!("header {n}"), text)?);
        }
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
        let opts: Vec<CString> = options.iter().map(|o| cstring("an option", o)).collect::<Result<_, _>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
        let too_many = |what: &str| CudaError::BadInput { what: format!("too many {what}") };
        let num_headers = i32::try_from(headers.len()).map_err(|_| too_many("headers"))?;
        let num_options = i32::try_from(options.len()).map_err(|_| too_many("options"))?;

        let mut prog: Handle = std::ptr::null_mut();
        // SAFETY: every pointer is to a live NUL-terminated string owned above, and the two
        // header arrays hold `num_headers` entries each (NVRTC copies them all).
        let r = unsafe {
            (self.lib.create_program)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                num_headers,
                if headers.is_empty() { std::ptr::null() } else { text_ptrs.as_ptr() },
                if headers.is_empty() { std::ptr::null() } else { name_ptrs.as_ptr() },
            )
        };
        self.lib.check("nvrtcCreateProgram", r)?;
        let prog = Program { lib: self.lib, prog };
        // SAFETY: `prog` is live; `opt_ptrs` holds `num_options` live NUL-terminated strings.
        let r = unsafe {
            (self.lib.compile_program)(
                prog.prog,
                num_options,
                if options.is_empty() { std::ptr::null() } else { opt_ptrs.as_ptr() },
            )
        };
        if r == NVRTC_ERROR_COMPILATION {
            return Err(CudaError::Compile { program: name.to_string(), log: prog.log() });
        }
        if r != NVRTC_SUCCESS {
            let log = prog.log();
            return match self.lib.check("nvrtcCompileProgram", r) {
                Err(CudaError::Nvrtc { call, code, what }) if !log.trim().is_empty() => {
                    Err(CudaError::Nvrtc { call, code, what: format!("{what}: {}", log.trim()) })
                }
                other => other.map(|()| prog),
            };
        }
        Ok(prog)
    }
}

// ---------------------------------------------------------------------------------------
// Device and context
// ---------------------------------------------------------------------------------------

/// One device's retained primary context; released when the last [`Cuda`] clone drops.
struct Context {
    drv: &'static Driver,
    ordinal: usize,
    dev: CuDevice,
    ctx: Handle,
    nvrtc: OnceLock<Nvrtc>,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API is thread-safe;
// each thread binds it with cuCtxSetCurrent before use, which `Cuda::bind` does); the other
// fields are plain data or `Sync` themselves.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only exposes reads of immutable fields and driver calls.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: this context retained the primary context once (Cuda::open) and releases
        // it once; every resource made in it holds a clone of the `Cuda` and so is gone.
        let _ = unsafe { (self.drv.cu_device_primary_ctx_release)(self.dev) };
    }
}

/// One CUDA device, through its primary context. `Send + Sync`; cloning is cheap (an `Arc`).
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Context>,
}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda").field("ordinal", &self.inner.ordinal).field("driver", &self.inner.drv.path).finish()
    }
}

impl Cuda {
    /// Opens device `ordinal` (0 is the first): loads the driver, initialises it, and retains
    /// the device's primary context (the one the CUDA runtime and other libraries share).
    ///
    /// Fails with [`CudaError::NoDriver`] where no NVIDIA driver is installed and with
    /// [`CudaError::NoDevice`] where it finds no GPU.
    pub fn open(ordinal: usize) -> Result<Cuda, CudaError> {
        let drv = driver()?;
        // SAFETY: cuInit takes flags, which must be 0.
        let r = unsafe { (drv.cu_init)(0) };
        if r == CUDA_ERROR_NO_DEVICE {
            return Err(CudaError::NoDevice);
        }
        drv.check("cuInit", r)?;
        let mut count = 0i32;
        // SAFETY: `count` is a valid place for one int.
        drv.check("cuDeviceGetCount", unsafe { (drv.cu_device_get_count)(&mut count) })?;
        if count <= 0 {
            return Err(CudaError::NoDevice);
        }
        let index = i32::try_from(ordinal).ok().filter(|&i| i < count).ok_or_else(|| CudaError::BadInput {
            what: format!("device ordinal {ordinal}: the driver found {count} device(s)"),
        })?;
        let mut dev: CuDevice = 0;
        // SAFETY: `dev` is a valid place for one CUdevice; `index` is in range.
        drv.check("cuDeviceGet", unsafe { (drv.cu_device_get)(&mut dev, index) })?;
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid place for one handle; `dev` came from cuDeviceGet.
        drv.check("cuDevicePrimaryCtxRetain", unsafe { (drv.cu_device_primary_ctx_retain)(&mut ctx, dev) })?;
        let cuda = Cuda { inner: Arc::new(Context { drv, ordinal, dev, ctx, nvrtc: OnceLock::new() }) };
        cuda.bind()?;
        Ok(cuda)
    }

    fn drv(&self) -> &'static Driver {
        self.inner.drv
    }

    /// Runs one destructor call (`cuStreamDestroy`, `cuMemFree`, ...) for a value being
    /// dropped, with this context bound. A drop cannot report a failure, and a context that
    /// will not bind has nothing left to free, so errors are dropped here, in one place.
    fn release(&self, destroy: impl FnOnce(&Driver) -> CuResult) {
        if self.bind().is_ok() {
            let _ = destroy(self.drv());
        }
    }

    /// Makes this device's context current on the calling thread. Every method calls it
    /// first: threads differ, and binding is cheap.
    fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: `ctx` is a retained primary context, live for as long as `self`.
        let r = unsafe { (self.drv().cu_ctx_set_current)(self.inner.ctx) };
        self.drv().check("cuCtxSetCurrent", r)
    }

    fn attribute(&self, attrib: i32) -> Result<i32, CudaError> {
        let mut v = 0i32;
        // SAFETY: `v` is a valid place for one int; `dev` is a valid device.
        let r = unsafe { (self.drv().cu_device_get_attribute)(&mut v, attrib, self.inner.dev) };
        self.drv().check("cuDeviceGetAttribute", r)?;
        Ok(v)
    }

    /// The device ordinal this was opened with.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// Where the driver library was loaded from.
    pub fn driver_path(&self) -> &str {
        &self.drv().path
    }

    /// The device's name ("NVIDIA H200").
    pub fn name(&self) -> Result<String, CudaError> {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` has room for `len` bytes, and the driver writes at most that many,
        // NUL-terminated.
        let r = unsafe { (self.drv().cu_device_get_name)(buf.as_mut_ptr().cast(), buf.len() as i32, self.inner.dev) };
        self.drv().check("cuDeviceGetName", r)?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// Streaming multiprocessors on the device.
    pub fn sm_count(&self) -> Result<u32, CudaError> {
        let n = self.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        u32::try_from(n).map_err(|_| CudaError::Unsupported { what: format!("the driver reports {n} SMs") })
    }

    /// (major, minor) compute capability: (9, 0) for Hopper.
    pub fn compute_capability(&self) -> Result<(i32, i32), CudaError> {
        Ok((
            self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// The driver's CUDA version, as 1000 × major + 10 × minor (13000 for CUDA 13.0).
    pub fn driver_version(&self) -> Result<i32, CudaError> {
        let mut v = 0i32;
        // SAFETY: `v` is a valid place for one int.
        let r = unsafe { (self.drv().cu_driver_get_version)(&mut v) };
        self.drv().check("cuDriverGetVersion", r)?;
        Ok(v)
    }

    /// Whether the device can map host memory into its address space (needed by
    /// [`PinnedBuffer`] and [`Registration`]).
    pub fn can_map_host_memory(&self) -> Result<bool, CudaError> {
        Ok(self.attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? != 0)
    }

    /// Whether host and device share one virtual address space (UVA).
    pub fn unified_addressing(&self) -> Result<bool, CudaError> {
        Ok(self.attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0)
    }

    /// Whether the link to the host supports every native atomic operation on host memory
    /// (NVLink-C2C systems; PCIe systems answer false).
    pub fn host_native_atomics(&self) -> Result<bool, CudaError> {
        Ok(self.attribute(CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED)? != 0)
    }

    /// Stream priorities, as (least, greatest). Lower numbers are higher priorities, so
    /// `greatest <= least` (for example (0, -5)).
    pub fn stream_priority_range(&self) -> Result<(i32, i32), CudaError> {
        self.bind()?;
        let (mut least, mut greatest) = (0i32, 0i32);
        // SAFETY: both are valid places for one int; a context is current (bind).
        let r = unsafe { (self.drv().cu_ctx_get_stream_priority_range)(&mut least, &mut greatest) };
        self.drv().check("cuCtxGetStreamPriorityRange", r)?;
        Ok((least, greatest))
    }

    /// NVRTC, loaded on first use.
    pub fn nvrtc(&self) -> Result<Nvrtc, CudaError> {
        if let Some(n) = self.inner.nvrtc.get() {
            return Ok(*n);
        }
        let n = Nvrtc::load()?;
        Ok(*self.inner.nvrtc.get_or_init(|| n))
    }

    /// Compiles `source` with NVRTC into a CUBIN for this device's architecture
    /// (`--gpu-architecture=sm_XY` is added before `options`), ready for
    /// [`load_module`](Self::load_module). See [`Nvrtc::compile`] for `headers`.
    pub fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[&str],
    ) -> Result<Vec<u8>, CudaError> {
        let nvrtc = self.nvrtc()?;
        let (major, minor) = self.compute_capability()?;
        let arch = format!("--gpu-architecture=sm_{major}{minor}");
        let mut opts = vec![arch.as_str()];
        opts.extend_from_slice(options);
        nvrtc.compile_cubin(name, source, headers, &opts)
    }

    /// Loads GPU code: a CUBIN (ELF) image or PTX text (NUL-terminated or not; a terminator
    /// is added if missing).
    pub fn load_module(&self, image: &[u8]) -> Result<Module, CudaError> {
        if image.is_empty() {
            return Err(CudaError::BadInput { what: "an empty module image".into() });
        }
        let owned;
        let data: &[u8] = if image.starts_with(b"\x7fELF") || image.last() == Some(&0) {
            image
        } else {
            owned = [image, &[0u8]].concat();
            &owned
        };
        self.bind()?;
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: `data` is a complete ELF image or NUL-terminated PTX text, alive for the
        // call (the driver copies it); `module` is a valid place for one handle.
        let r = unsafe { (self.drv().cu_module_load_data)(&mut module, data.as_ptr().cast()) };
        self.drv().check("cuModuleLoadData", r)?;
        Ok(Module { inner: Arc::new(ModuleInner { cuda: self.clone(), module }) })
    }

    /// Launches `f` on `stream` with a `grid` of blocks of `block` threads, `shared_bytes`
    /// of dynamic shared memory per block, and the arguments in `args`.
    ///
    /// The pushed arguments are checked against the kernel's parameter list (count and each
    /// size, from `cuFuncGetParamInfo`): a mismatch is [`CudaError::BadInput`] and nothing is
    /// launched, so the driver never reads past what the host supplied. What the checks
    /// cannot see is meaning: a `u64` pushed where the kernel expects a pointer is launched,
    /// and the kernel's use of it is the kernel's business (a bad address is a GPU fault,
    /// reported by a later call on the stream as a [`CudaError::Call`]; the host's memory is
    /// never at risk, but what the kernel does on the device is undefined).
    pub fn launch(
        &self,
        f: &Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: &Stream,
        args: &KernelArgs,
    ) -> Result<(), CudaError> {
        if f.module.cuda.inner.ctx != self.inner.ctx || stream.cuda.inner.ctx != self.inner.ctx {
            return Err(CudaError::BadInput {
                what: format!("kernel {} or its stream belongs to another device's context", f.name),
            });
        }
        f.check_args(args)?;
        self.bind()?;
        // The driver only reads through these pointers (kernelParams is `void**` in C for
        // historical reasons), so pointing them at shared storage is sound.
        let mut params: Vec<*mut c_void> = args.slots.iter().map(|s| s.as_ptr().cast_mut().cast()).collect();
        let params_ptr = if params.is_empty() { std::ptr::null_mut() } else { params.as_mut_ptr() };
        // SAFETY: `f` and `stream` are live handles of this context (checked above); there are
        // exactly as many parameter pointers as the kernel has parameters, each pointing to at
        // least as many bytes as that parameter's size (checked by `check_args`), all alive
        // for the call (the driver copies the values before returning); `extra` is NULL.
        let r = unsafe {
            (self.drv().cu_launch_kernel)(
                f.func,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                stream.stream,
                params_ptr,
                std::ptr::null_mut(),
            )
        };
        self.drv().check("cuLaunchKernel", r)
    }
}

// ---------------------------------------------------------------------------------------
// Modules, functions, arguments
// ---------------------------------------------------------------------------------------

struct ModuleInner {
    cuda: Cuda,
    module: Handle,
}

// SAFETY: a CUmodule handle may be used from any thread once its context is bound (every use
// binds first); the struct is otherwise immutable.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: `module` came from cuModuleLoadData and is unloaded once; every
        // Function of it holds this ModuleInner, so none is left.
        self.cuda.release(|d| unsafe { (d.cu_module_unload)(self.module) });
    }
}

/// Loaded GPU code; unloaded when it and every [`Function`] taken from it are dropped.
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module").finish_non_exhaustive()
    }
}

impl Module {
    /// The kernel named `name` (an `extern "C" __global__` function, so its name is not
    /// mangled).
    pub fn function(&self, name: &str) -> Result<Function, CudaError> {
        let cname = cstring("a kernel name", name)?;
        let cuda = &self.inner.cuda;
        cuda.bind()?;
        let mut func: Handle = std::ptr::null_mut();
        // SAFETY: `func` is a valid place for one handle; `module` is live; `cname` is a
        // NUL-terminated string alive for the call.
        let r = unsafe { (cuda.drv().cu_module_get_function)(&mut func, self.inner.module, cname.as_ptr()) };
        cuda.drv().check("cuModuleGetFunction", r)?;
        let params = param_sizes(cuda.drv(), func)?;
        Ok(Function { module: self.inner.clone(), func, name: name.to_string(), params })
    }
}

/// The sizes of `func`'s parameters, or `None` where the driver cannot say.
fn param_sizes(drv: &Driver, func: Handle) -> Result<Option<Vec<usize>>, CudaError> {
    let Some(info) = drv.cu_func_get_param_info else { return Ok(None) };
    let mut sizes = Vec::new();
    // A kernel has at most a few thousand parameters (4 KiB, 32 KiB on Hopper, of them).
    for index in 0..32_768usize {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `func` is a live function of the bound context; both outputs are valid
        // places for one size_t. An index past the last parameter returns INVALID_VALUE.
        let r = unsafe { info(func, index, &mut offset, &mut size) };
        if r == CUDA_ERROR_INVALID_VALUE {
            return Ok(Some(sizes));
        }
        drv.check("cuFuncGetParamInfo", r)?;
        sizes.push(size);
    }
    Err(CudaError::Unsupported { what: "a kernel with more than 32768 parameters".into() })
}

/// A kernel of a loaded [`Module`] (which it keeps loaded).
pub struct Function {
    module: Arc<ModuleInner>,
    func: Handle,
    name: String,
    params: Option<Vec<usize>>,
}

// SAFETY: a CUfunction handle may be used from any thread once its context is bound (every
// use binds first); the struct is otherwise immutable.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function").field("name", &self.name).field("params", &self.params).finish()
    }
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The byte size of each parameter, in order (`None` on drivers older than CUDA 12.4).
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    fn attribute(&self, attrib: i32) -> Result<i32, CudaError> {
        let cuda = &self.module.cuda;
        cuda.bind()?;
        let mut v = 0i32;
        // SAFETY: `v` is a valid place for one int; `func` is live.
        let r = unsafe { (cuda.drv().cu_func_get_attribute)(&mut v, attrib, self.func) };
        cuda.drv().check("cuFuncGetAttribute", r)?;
        Ok(v)
    }

    /// The most threads a block of this kernel may have (limited by its register use).
    pub fn max_threads(&self) -> Result<u32, CudaError> {
        Ok(self.attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?.max(0) as u32)
    }

    /// Registers each thread of this kernel uses.
    pub fn num_regs(&self) -> Result<u32, CudaError> {
        Ok(self.attribute(CU_FUNC_ATTRIBUTE_NUM_REGS)?.max(0) as u32)
    }

    /// Allows launches with up to `bytes` of dynamic shared memory per block (needed above
    /// 48 KiB; at most the device's opt-in limit).
    pub fn set_max_dynamic_shared(&self, bytes: u32) -> Result<(), CudaError> {
        let value = i32::try_from(bytes)
            .map_err(|_| CudaError::BadInput { what: format!("{bytes} bytes of shared memory") })?;
        let cuda = &self.module.cuda;
        cuda.bind()?;
        // SAFETY: `func` is live; the attribute takes an int byte count.
        let r = unsafe {
            (cuda.drv().cu_func_set_attribute)(self.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value)
        };
        cuda.drv().check("cuFuncSetAttribute", r)
    }

    /// Checks `args` against the parameter list (see [`Cuda::launch`]).
    fn check_args(&self, args: &KernelArgs) -> Result<(), CudaError> {
        let Some(params) = &self.params else {
            return Err(CudaError::Unsupported {
                what: "cuFuncGetParamInfo (CUDA 12.4 or later), needed to check kernel arguments".into(),
            });
        };
        if params.len() != args.len() {
            return Err(CudaError::BadInput {
                what: format!("kernel {} takes {} parameters, {} were pushed", self.name, params.len(), args.len()),
            });
        }
        for (i, (&want, got)) in params.iter().zip(&args.sizes).enumerate() {
            if want != *got as usize {
                return Err(CudaError::BadInput {
                    what: format!("kernel {} parameter {i} is {want} bytes, a {got}-byte value was pushed", self.name),
                });
            }
        }
        Ok(())
    }
}

/// A kernel's arguments, collected by value in order ("push" one per parameter).
///
/// Each value is stored in its own 8-byte slot (its native-endian bytes first), and a launch
/// hands the driver one pointer per slot. The sizes must match the kernel's parameters; see
/// [`Cuda::launch`].
#[derive(Debug, Clone, Default)]
pub struct KernelArgs {
    slots: Vec<[u8; 8]>,
    sizes: Vec<u8>,
}

impl KernelArgs {
    /// No arguments.
    pub fn new() -> KernelArgs {
        KernelArgs::default()
    }

    fn push_bytes(&mut self, bytes: &[u8]) -> &mut Self {
        let mut slot = [0u8; 8];
        slot[..bytes.len()].copy_from_slice(bytes);
        self.slots.push(slot);
        self.sizes.push(bytes.len() as u8);
        self
    }

    /// Appends a `u64` (`unsigned long long`).
    pub fn push_u64(&mut self, v: u64) -> &mut Self {
        self.push_bytes(&v.to_ne_bytes())
    }

    /// Appends an `i64` (`long long`).
    pub fn push_i64(&mut self, v: i64) -> &mut Self {
        self.push_bytes(&v.to_ne_bytes())
    }

    /// Appends a `u32` (`unsigned int`).
    pub fn push_u32(&mut self, v: u32) -> &mut Self {
        self.push_bytes(&v.to_ne_bytes())
    }

    /// Appends an `i32` (`int`).
    pub fn push_i32(&mut self, v: i32) -> &mut Self {
        self.push_bytes(&v.to_ne_bytes())
    }

    /// Appends a device address (any pointer parameter: 8 bytes).
    pub fn push_ptr(&mut self, dev: u64) -> &mut Self {
        self.push_u64(dev)
    }

    /// How many arguments were pushed.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether none were pushed.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Removes every argument (keeping the storage).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.sizes.clear();
    }
}

// ---------------------------------------------------------------------------------------
// Streams and graphs
// ---------------------------------------------------------------------------------------

/// A non-blocking stream (it does not wait for the legacy default stream), destroyed on
/// drop. Destroying a stream does not wait for its work: the driver frees it when the work
/// ends, so keep what its kernels use alive until [`wait`](Self::wait) says they are done.
pub struct Stream {
    cuda: Cuda,
    stream: Handle,
    priority: i32,
}

// SAFETY: a CUstream handle may be used from any thread once its context is bound (every use
// binds first); the struct is otherwise immutable.
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serialises concurrent calls on one stream.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").field("priority", &self.priority).finish()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `stream` came from cuStreamCreateWithPriority and is destroyed once.
        self.cuda.release(|d| unsafe { (d.cu_stream_destroy)(self.stream) });
    }
}

impl Stream {
    /// A stream of `priority` (see [`Cuda::stream_priority_range`]; the driver clamps values
    /// outside it).
    pub fn new(cuda: &Cuda, priority: i32) -> Result<Stream, CudaError> {
        cuda.bind()?;
        let mut stream: Handle = std::ptr::null_mut();
        // SAFETY: `stream` is a valid place for one handle; a context is current.
        let r = unsafe { (cuda.drv().cu_stream_create_with_priority)(&mut stream, CU_STREAM_NON_BLOCKING, priority) };
        cuda.drv().check("cuStreamCreateWithPriority", r)?;
        Ok(Stream { cuda: cuda.clone(), stream, priority })
    }

    /// The priority it was created with.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Blocks until every operation on the stream has finished (no time limit: prefer
    /// [`wait`](Self::wait) where a kernel might not end).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.cuda.bind()?;
        // SAFETY: `stream` is live.
        let r = unsafe { (self.cuda.drv().cu_stream_synchronize)(self.stream) };
        self.cuda.drv().check("cuStreamSynchronize", r)
    }

    /// Whether every operation on the stream has finished. A fault in its work is returned
    /// as the error.
    pub fn query(&self) -> Result<bool, CudaError> {
        self.cuda.bind()?;
        // SAFETY: `stream` is live.
        let r = unsafe { (self.cuda.drv().cu_stream_query)(self.stream) };
        if r == CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.cuda.drv().check("cuStreamQuery", r)?;
        Ok(true)
    }

    /// Polls [`query`](Self::query) until the stream is idle, or fails with
    /// [`CudaError::Timeout`] after `timeout`. Spins for the first 100 µs, then yields the
    /// thread between polls.
    pub fn wait(&self, timeout: Duration) -> Result<(), CudaError> {
        let start = Instant::now();
        loop {
            if self.query()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited > timeout {
                return Err(CudaError::Timeout {
                    what: format!("a stream (priority {}) to finish its work", self.priority),
                    after_ms: waited.as_millis() as u64,
                });
            }
            if waited < Duration::from_micros(100) {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Starts capturing the work enqueued on this stream into a graph (thread-local mode:
    /// until [`end_capture`](Self::end_capture), this thread may not make calls that are
    /// unsafe during capture, such as allocations; other threads are unaffected).
    pub fn begin_capture(&self) -> Result<(), CudaError> {
        self.cuda.bind()?;
        // SAFETY: `stream` is live and not the legacy default stream.
        let r = unsafe { (self.cuda.drv().cu_stream_begin_capture)(self.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) };
        self.cuda.drv().check("cuStreamBeginCapture", r)
    }

    /// Ends the capture begun by [`begin_capture`](Self::begin_capture) (on the same thread)
    /// and returns the captured work as a graph.
    pub fn end_capture(&self) -> Result<Graph, CudaError> {
        self.cuda.bind()?;
        let mut graph: Handle = std::ptr::null_mut();
        // SAFETY: `stream` is live; `graph` is a valid place for one handle.
        let r = unsafe { (self.cuda.drv().cu_stream_end_capture)(self.stream, &mut graph) };
        self.cuda.drv().check("cuStreamEndCapture", r)?;
        if graph.is_null() {
            return Err(CudaError::Unsupported { what: "cuStreamEndCapture returned no graph".into() });
        }
        Ok(Graph { cuda: self.cuda.clone(), graph })
    }
}

/// A captured graph of work; destroyed on drop.
pub struct Graph {
    cuda: Cuda,
    graph: Handle,
}

// SAFETY: a CUgraph handle may be used from any thread once its context is bound.
unsafe impl Send for Graph {}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph").finish_non_exhaustive()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: `graph` came from cuStreamEndCapture and is destroyed once.
        self.cuda.release(|d| unsafe { (d.cu_graph_destroy)(self.graph) });
    }
}

impl Graph {
    /// Makes an executable graph of it (independent of this graph afterwards).
    pub fn instantiate(&self) -> Result<GraphExec, CudaError> {
        self.cuda.bind()?;
        let mut exec: Handle = std::ptr::null_mut();
        // SAFETY: `graph` is live; `exec` is a valid place for one handle; flags 0.
        let r = unsafe { (self.cuda.drv().cu_graph_instantiate)(&mut exec, self.graph, 0) };
        self.cuda.drv().check("cuGraphInstantiateWithFlags", r)?;
        Ok(GraphExec { cuda: self.cuda.clone(), exec })
    }
}

/// An executable graph; destroyed on drop.
pub struct GraphExec {
    cuda: Cuda,
    exec: Handle,
}

// SAFETY: a CUgraphExec handle may be used from any thread once its context is bound.
unsafe impl Send for GraphExec {}
// SAFETY: as above; the driver serialises launches of one executable graph.
unsafe impl Sync for GraphExec {}

impl fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphExec").finish_non_exhaustive()
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: `exec` came from cuGraphInstantiateWithFlags and is destroyed once.
        self.cuda.release(|d| unsafe { (d.cu_graph_exec_destroy)(self.exec) });
    }
}

impl GraphExec {
    /// Enqueues the graph's work on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<(), CudaError> {
        if stream.cuda.inner.ctx != self.cuda.inner.ctx {
            return Err(CudaError::BadInput { what: "a graph launched on another device's stream".into() });
        }
        self.cuda.bind()?;
        // SAFETY: `exec` and `stream` are live handles of the same context.
        let r = unsafe { (self.cuda.drv().cu_graph_launch)(self.exec, stream.stream) };
        self.cuda.drv().check("cuGraphLaunch", r)
    }
}

// ---------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------

/// Checks that `[offset, offset + len)` lies in a buffer of `size` bytes.
fn in_bounds(what: &str, offset: usize, len: usize, size: usize) -> Result<(), CudaError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(CudaError::BadInput {
            what: format!("{what} of {len} bytes at offset {offset} in a {size}-byte buffer"),
        }),
    }
}

/// Pinned (page-locked) host memory mapped into the device's address space: the CPU reads
/// and writes it at [`host_ptr`](Self::host_ptr), the GPU over PCIe at [`dev`](Self::dev).
/// Zeroed when made; freed on drop.
///
/// Both sides may touch it at once, so the host side is accessed only through atomics
/// ([`atomic_u64`](Self::atomic_u64), [`atomic_u32`](Self::atomic_u32)) or volatile
/// accesses through [`host_ptr`](Self::host_ptr); the GPU's aligned 4- and 8-byte stores
/// are single PCIe writes, never torn.
pub struct PinnedBuffer {
    cuda: Cuda,
    host: *mut u8,
    dev: u64,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; its host side is only reached
// through atomics or raw pointers whose users take responsibility, so sharing is sound.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above.
unsafe impl Sync for PinnedBuffer {}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer").field("dev", &format_args!("{:#x}", self.dev)).field("len", &self.len).finish()
    }
}

impl PinnedBuffer {
    /// Allocates `len` bytes (`cuMemHostAlloc`, portable and device-mapped), zeroed.
    pub fn new(cuda: &Cuda, len: usize) -> Result<PinnedBuffer, CudaError> {
        if len == 0 {
            return Err(CudaError::BadInput { what: "a pinned buffer of 0 bytes".into() });
        }
        cuda.bind()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` is a valid place for one pointer; a context is current.
        let r = unsafe {
            (cuda.drv().cu_mem_host_alloc)(&mut host, len, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)
        };
        cuda.drv().check("cuMemHostAlloc", r)?;
        if host.is_null() {
            return Err(CudaError::Unsupported { what: "cuMemHostAlloc returned NULL".into() });
        }
        // From here on the buffer frees itself on any error.
        let mut buf = PinnedBuffer { cuda: cuda.clone(), host: host.cast(), dev: 0, len };
        // SAFETY: `host` points to `len` freshly allocated, writable bytes that nothing else
        // uses yet.
        unsafe { std::ptr::write_bytes(buf.host, 0, len) };
        let mut dev: CuDevicePtr = 0;
        // SAFETY: `dev` is a valid place for one device pointer; `host` is the start of a
        // device-mapped allocation; flags must be 0.
        let r = unsafe { (cuda.drv().cu_mem_host_get_device_pointer)(&mut dev, host, 0) };
        cuda.drv().check("cuMemHostGetDevicePointer", r)?;
        buf.dev = dev;
        Ok(buf)
    }

    /// The host address of byte 0 (page-aligned). Valid while `self` lives; concurrent GPU
    /// access means reads and writes through it should be volatile or atomic.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The device address of byte 0 (equal to the host address under unified addressing).
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer is never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 8-aligned `u64` at byte `offset`, as an atomic; `None` if out of bounds or
    /// misaligned.
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) || in_bounds("a u64", offset, 8, self.len).is_err() {
            return None;
        }
        // SAFETY: in bounds and 8-aligned (the base is page-aligned), valid for the life of
        // `&self`. Other actors (the GPU) touch the word only with single aligned accesses,
        // which is what an atomic requires of them.
        Some(unsafe { AtomicU64::from_ptr(self.host.add(offset).cast()) })
    }

    /// The 4-aligned `u32` at byte `offset`, as an atomic; like [`atomic_u64`](Self::atomic_u64).
    pub fn atomic_u32(&self, offset: usize) -> Option<&AtomicU32> {
        if !offset.is_multiple_of(4) || in_bounds("a u32", offset, 4, self.len).is_err() {
            return None;
        }
        // SAFETY: as in `atomic_u64`, for a 4-aligned 4-byte word.
        Some(unsafe { AtomicU32::from_ptr(self.host.add(offset).cast()) })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: `host` came from cuMemHostAlloc and is freed once; no reference from
        // `atomic_*` outlives `&self`.
        self.cuda.release(|d| unsafe { (d.cu_mem_free_host)(self.host.cast()) });
    }
}

/// An existing host range (such as a memfd `MAP_SHARED` mapping) page-locked and mapped into
/// the device's address space (`cuMemHostRegister`, portable and device-mapped);
/// unregistered on drop.
pub struct Registration {
    cuda: Cuda,
    host: *mut u8,
    dev: u64,
    len: usize,
}

// SAFETY: the registration only records addresses; the memory is the caller's (see `new`).
unsafe impl Send for Registration {}
// SAFETY: as above.
unsafe impl Sync for Registration {}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("host", &self.host)
            .field("dev", &format_args!("{:#x}", self.dev))
            .field("len", &self.len)
            .finish()
    }
}

impl Registration {
    /// Registers the `len` bytes at `host` with the device.
    ///
    /// `host` and `len` must be multiples of 4096 (whole pages).
    ///
    /// # Safety
    /// The range must be mapped, readable and writable, and stay mapped (not `munmap`ed or
    /// remapped) for as long as the returned value lives: the GPU may read and write it at
    /// any time until then, and unregistering an unmapped range is undefined in the driver.
    /// Whatever else touches the range must tolerate the GPU's concurrent accesses (atomics or
    /// volatile accesses on the host side).
    pub unsafe fn new(cuda: &Cuda, host: *mut u8, len: usize) -> Result<Registration, CudaError> {
        if host.is_null() || len == 0 || !(host as usize).is_multiple_of(HOST_PAGE) || !len.is_multiple_of(HOST_PAGE) {
            return Err(CudaError::BadInput {
                what: format!("registering {len} bytes at {host:p}: need a non-empty range of whole 4 KiB pages"),
            });
        }
        cuda.bind()?;
        // SAFETY: the caller guarantees the range is mapped and stays so while registered.
        let r = unsafe {
            (cuda.drv().cu_mem_host_register)(
                host.cast(),
                len,
                CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
            )
        };
        cuda.drv().check("cuMemHostRegister", r)?;
        let mut reg = Registration { cuda: cuda.clone(), host, dev: 0, len };
        let mut dev: CuDevicePtr = 0;
        // SAFETY: `dev` is a valid place for one device pointer; `host` is the start of a
        // registered, device-mapped range; flags must be 0.
        let r = unsafe { (cuda.drv().cu_mem_host_get_device_pointer)(&mut dev, host.cast(), 0) };
        cuda.drv().check("cuMemHostGetDevicePointer", r)?;
        reg.dev = dev;
        Ok(reg)
    }

    /// The device address of the range's first byte.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// The host address of the range's first byte.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a registration is never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: `host` was registered by `new` and is unregistered once; the caller of
        // `new` guaranteed it is still mapped.
        self.cuda.release(|d| unsafe { (d.cu_mem_host_unregister)(self.host.cast()) });
    }
}

/// Device memory (`cuMemAlloc`); freed on drop.
///
/// The copies and fills below run on the legacy default stream and return when done. That
/// stream does not wait for this crate's (non-blocking) streams: do not copy into memory a
/// running kernel uses.
pub struct DeviceBuffer {
    cuda: Cuda,
    dev: u64,
    len: usize,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer").field("dev", &format_args!("{:#x}", self.dev)).field("len", &self.len).finish()
    }
}

impl DeviceBuffer {
    /// Allocates `len` bytes of device memory (contents undefined: see
    /// [`memset_u8`](Self::memset_u8)).
    pub fn new(cuda: &Cuda, len: usize) -> Result<DeviceBuffer, CudaError> {
        if len == 0 {
            return Err(CudaError::BadInput { what: "a device buffer of 0 bytes".into() });
        }
        cuda.bind()?;
        let mut dev: CuDevicePtr = 0;
        // SAFETY: `dev` is a valid place for one device pointer; a context is current.
        let r = unsafe { (cuda.drv().cu_mem_alloc)(&mut dev, len) };
        cuda.drv().check("cuMemAlloc", r)?;
        Ok(DeviceBuffer { cuda: cuda.clone(), dev, len })
    }

    /// The device address of byte 0.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer is never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits for the legacy default stream, where the copies and fills run.
    fn finish(&self) -> Result<(), CudaError> {
        // SAFETY: the legacy default stream always exists in a current context.
        let r = unsafe { (self.cuda.drv().cu_stream_synchronize)(NULL_STREAM) };
        self.cuda.drv().check("cuStreamSynchronize", r)
    }

    /// Copies `src` to byte `offset` of the buffer; returns when the copy is done.
    pub fn copy_from_host(&self, src: &[u8], offset: usize) -> Result<(), CudaError> {
        in_bounds("a copy to the device", offset, src.len(), self.len)?;
        if src.is_empty() {
            return Ok(());
        }
        self.cuda.bind()?;
        // SAFETY: the destination range is inside the allocation (checked); `src` is alive
        // until `finish` below has waited for the copy to end.
        let r = unsafe {
            (self.cuda.drv().cu_memcpy_htod_async)(
                self.dev + offset as u64,
                src.as_ptr().cast(),
                src.len(),
                NULL_STREAM,
            )
        };
        self.cuda.drv().check("cuMemcpyHtoDAsync", r)?;
        self.finish()
    }

    /// Copies from byte `offset` of the buffer into `dst`; returns when the copy is done.
    pub fn copy_to_host(&self, dst: &mut [u8], offset: usize) -> Result<(), CudaError> {
        in_bounds("a copy from the device", offset, dst.len(), self.len)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.cuda.bind()?;
        // SAFETY: the source range is inside the allocation (checked); `dst` is exclusively
        // borrowed until `finish` below has waited for the copy to end.
        let r = unsafe {
            (self.cuda.drv().cu_memcpy_dtoh_async)(
                dst.as_mut_ptr().cast(),
                self.dev + offset as u64,
                dst.len(),
                NULL_STREAM,
            )
        };
        self.cuda.drv().check("cuMemcpyDtoHAsync", r)?;
        self.finish()
    }

    /// Sets every byte of the buffer to `value`; returns when done.
    pub fn memset_u8(&self, value: u8) -> Result<(), CudaError> {
        self.cuda.bind()?;
        // SAFETY: the whole allocation, `len` bytes, is written.
        let r = unsafe { (self.cuda.drv().cu_memset_d8_async)(self.dev, value, self.len, NULL_STREAM) };
        self.cuda.drv().check("cuMemsetD8Async", r)?;
        self.finish()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `dev` came from cuMemAlloc and is freed once.
        self.cuda.release(|d| unsafe { (d.cu_mem_free)(self.dev) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_a_driver_is_a_typed_error() {
        match Cuda::open(0) {
            Err(e @ (CudaError::NoDriver { .. } | CudaError::NoDevice)) => {
                let msg = e.to_string();
                assert!(msg.contains("no NVIDIA GPU driver found (libcuda): tried") || msg.contains("no CUDA device"));
                if let CudaError::NoDriver { tried, .. } = &e {
                    assert!(tried.iter().any(|t| t == "libcuda.so.1"), "{tried:?}");
                    assert!(msg.contains("libcuda.so.1"), "{msg}");
                }
            }
            Err(e) => panic!("unexpected error: {e}"),
            // A machine with a GPU: nothing to check here (tests/driver.rs covers it).
            Ok(cuda) => assert!(cuda.name().is_ok()),
        }
    }

    #[test]
    fn the_env_path_is_tried_first_and_named() {
        let tried = libcuda_candidates(Some("/nonexistent".into()));
        assert_eq!(tried[0], "/nonexistent");
        assert_eq!(tried[1], "libcuda.so.1");
        assert_eq!(libcuda_candidates(Some(String::new()))[0], "libcuda.so.1");
        let Err(e) = load_driver_from(&["/nonexistent".to_string()]) else { panic!("/nonexistent loaded") };
        let msg = e.to_string();
        assert!(msg.starts_with("no NVIDIA GPU driver found (libcuda): tried /nonexistent"), "{msg}");
        assert!(matches!(e, CudaError::NoDriver { ref tried, .. } if tried == &["/nonexistent".to_string()]));
    }

    #[test]
    fn nvrtc_candidates_start_with_the_env_path_and_hold_no_builtins() {
        let c = nvrtc_candidates(Some("/x/libnvrtc.so.13".into()));
        assert_eq!(c[0], "/x/libnvrtc.so.13");
        assert!(c.contains(&"libnvrtc.so.13".to_string()));
        assert!(c.iter().all(|p| !p.contains("builtins")), "{c:?}");
        let mut dedup = c.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), c.len(), "no path is tried twice");
    }

    #[test]
    fn kernel_args_keep_sizes_and_native_bytes() {
        let mut a = KernelArgs::new();
        a.push_u64(0x0102_0304_0506_0708).push_u32(7).push_i32(-1).push_ptr(0xdead_beef);
        assert_eq!(a.len(), 4);
        assert_eq!(a.sizes, [8, 4, 4, 8]);
        assert_eq!(u64::from_ne_bytes(a.slots[0]), 0x0102_0304_0506_0708);
        assert_eq!(u32::from_ne_bytes(a.slots[1][..4].try_into().unwrap()), 7);
        assert_eq!(i32::from_ne_bytes(a.slots[2][..4].try_into().unwrap()), -1);
        a.clear();
        assert!(a.is_empty());
    }

    #[test]
    fn bounds_checks_refuse_overflow() {
        assert!(in_bounds("x", 0, 8, 8).is_ok());
        assert!(in_bounds("x", 1, 8, 8).is_err());
        assert!(in_bounds("x", usize::MAX, 2, 8).is_err());
    }
}
