//! The NVIDIA backing: the engine program (`device/engine.cu`) compiled at run time by NVRTC
//! and launched once as a persistent kernel, one warp per hardware queue slot.
//!
//! The slots' command blocks, status blocks, event rings and tables are pinned host memory
//! mapped into the GPU (`cuMemHostAlloc`); the clients' shared memory (memfd arenas) is
//! registered with the driver (`cuMemHostRegister`) the first time a queue or a page table
//! names it, so the bytes a client writes are the bytes the GPU reads. Nothing on the data
//! path calls the driver: the host and the program speak only through that memory, which is
//! why a submission costs what PCIe costs.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu::hw::HwError;
use shm::DmaArea;

use crate::driver::{Cuda, CudaError, DeviceBuffer, KernelArgs, Module, PinnedBuffer, Registration, Stream};
use crate::host::Backing;
use crate::layout;
use crate::shared::SharedBuf;

/// The engine program's sources, as NVRTC is given them (the headers by the names
/// engine.cu includes).
pub const ENGINE_SOURCE: &str = include_str!("../device/engine.cu");
/// The headers engine.cu includes.
pub const ENGINE_HEADERS: [(&str, &str); 3] = [
    ("common.cuh", include_str!("../device/common.cuh")),
    ("layout.cuh", include_str!("../device/layout.cuh")),
    ("isa.cuh", include_str!("../device/isa.cuh")),
];
/// NVRTC options: IEEE single precision exactly as the CPU engine computes it (no fused
/// multiply-add contraction, no flush of denormals, correctly rounded division and square
/// root), so results are bit-identical.
pub const ENGINE_OPTIONS: [&str; 5] =
    ["--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "-default-device"];

/// How long one look for a slot's acknowledgement spins before the host drains the slot's
/// events and looks again.
const SETTLE_ROUND: Duration = Duration::from_micros(200);

fn failed(e: CudaError) -> HwError {
    HwError::Failed(e.to_string())
}

/// The NVIDIA backing. See the module docs.
pub struct Nvidia {
    cuda: Cuda,
    name: String,
    module: Option<Module>,
    stream: Option<Stream>,
    /// Registrations first (they unregister before their mappings may go).
    regs: Vec<(Registration, DmaArea)>,
    private: Vec<DeviceBuffer>,
    /// The GPU's global timer at `clock_at`.
    clock: u64,
    clock_at: Instant,
}

impl Nvidia {
    /// Opens GPU `ordinal` and checks it can run the engine program: it maps host memory
    /// and shares the host's address space (unified addressing).
    pub fn open(ordinal: usize) -> Result<Nvidia, CudaError> {
        let cuda = Cuda::open(ordinal)?;
        if !cuda.can_map_host_memory()? || !cuda.unified_addressing()? {
            return Err(CudaError::Unsupported {
                what: "a GPU that maps host memory with unified addressing (the rings live in host memory)".into(),
            });
        }
        let name = cuda.name()?;
        Ok(Nvidia {
            cuda,
            name,
            module: None,
            stream: None,
            regs: Vec::new(),
            private: Vec::new(),
            clock: 0,
            clock_at: Instant::now(),
        })
    }

    /// The driver handle.
    pub fn cuda(&self) -> &Cuda {
        &self.cuda
    }

    /// Compiles the engine program for this GPU (NVRTC, run time), once per process: every
    /// device of the process (a test's, a benchmark's several) loads the same image.
    pub fn compile(&self) -> Result<Vec<u8>, CudaError> {
        static IMAGE: std::sync::Mutex<Option<(String, Vec<u8>)>> = std::sync::Mutex::new(None);
        let arch = format!("{:?}", self.cuda.compute_capability()?);
        let mut cached = IMAGE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((a, image)) = cached.as_ref()
            && *a == arch
        {
            return Ok(image.clone());
        }
        let image = self.cuda.compile("engine.cu", ENGINE_SOURCE, &ENGINE_HEADERS, &ENGINE_OPTIONS)?;
        *cached = Some((arch, image.clone()));
        Ok(image)
    }

    /// Reads the GPU's global timer against the host's clock (half a launch round trip of
    /// error, a few microseconds).
    fn calibrate(&mut self, module: &Module, stream: &Stream) -> Result<(), CudaError> {
        let f = module.function("engine_clock")?;
        let out = PinnedBuffer::new(&self.cuda, 4096)?;
        let mut args = KernelArgs::new();
        args.push_ptr(out.dev());
        let before = Instant::now();
        self.cuda.launch(&f, [1, 1, 1], [1, 1, 1], 0, stream, &args)?;
        stream.wait(Duration::from_secs(5))?;
        let after = Instant::now();
        let word = out.atomic_u64(0).ok_or(CudaError::BadInput { what: "calibration word".into() })?;
        // Acquire: the kernel's store completed (the stream finished) before this load.
        self.clock = word.load(Ordering::Acquire);
        self.clock_at = before + (after - before) / 2;
        Ok(())
    }
}

impl Backing for Nvidia {
    fn name(&self) -> String {
        format!("{} (CUDA)", self.name)
    }

    fn shared(&mut self, bytes: usize) -> Result<SharedBuf, HwError> {
        let b = PinnedBuffer::new(&self.cuda, bytes.max(4096)).map_err(failed)?;
        let (host, dev, len) = (b.host_ptr(), b.dev(), b.len());
        let host = std::ptr::NonNull::new(host).ok_or_else(|| HwError::Failed("a null pinned buffer".into()))?;
        // SAFETY: `b` is a live, zeroed, page-aligned pinned allocation of `len` bytes that the
        // buffer owns (it frees it on drop); nothing else frees it.
        Ok(unsafe { SharedBuf::new(host, dev, len, Box::new(b)) })
    }

    fn private(&mut self, bytes: usize) -> Result<u64, HwError> {
        let b = DeviceBuffer::new(&self.cuda, bytes).map_err(failed)?;
        let dev = b.dev();
        self.private.push(b);
        Ok(dev)
    }

    fn register(&mut self, area: &DmaArea) -> Result<u64, HwError> {
        // From now on its freed pages are zeroed in place: the GPU keeps the pages it pinned.
        area.pin();
        // SAFETY: `area` is a whole-page mapping held mapped by the `DmaArea` stored beside
        // the registration, which drops after it (tuple order): the range stays mapped for
        // the registration's whole life.
        let r = unsafe { Registration::new(&self.cuda, area.addr() as *mut u8, area.len()) }.map_err(failed)?;
        let dev = r.dev();
        self.regs.push((r, area.clone()));
        Ok(dev)
    }

    fn start(&mut self, globals: &SharedBuf, slots: u32) -> Result<(), HwError> {
        let image = self.compile().map_err(failed)?;
        let module = self.cuda.load_module(&image).map_err(failed)?;
        let (_, greatest) = self.cuda.stream_priority_range().map_err(failed)?;
        let stream = Stream::new(&self.cuda, greatest).map_err(failed)?;
        self.calibrate(&module, &stream).map_err(failed)?;
        let f = module.function("engine_main").map_err(failed)?;
        let mut args = KernelArgs::new();
        args.push_ptr(globals.dev());
        self.cuda.launch(&f, [slots, 1, 1], [32, 1, 1], 0, &stream, &args).map_err(failed)?;
        self.module = Some(module);
        self.stream = Some(stream);
        Ok(())
    }

    fn run(&mut self, _globals: &SharedBuf, _active: &[bool]) -> bool {
        // The GPU runs by itself.
        false
    }

    fn settle(&mut self, _globals: &SharedBuf, status: &SharedBuf, slot: u32, seq: u64) -> Result<bool, HwError> {
        let ack = status.word(layout::at!(SlotStatus[slot as usize].ack));
        let until = Instant::now() + SETTLE_ROUND;
        // Acquire: pairs with the slot's release of its acknowledgement.
        while ack.load(Ordering::Acquire) < seq {
            if Instant::now() > until {
                // The program ended (a fault in it, a quit): nothing will ever answer.
                match self.stream.as_ref().map(Stream::query) {
                    Some(Ok(true)) => {
                        return Err(HwError::Failed(format!(
                            "the GPU engine program has stopped (slot {slot}, command {seq})"
                        )));
                    }
                    Some(Err(e)) => return Err(HwError::Failed(format!("the GPU engine program failed: {e}"))),
                    _ => {}
                }
                return Ok(false);
            }
            std::hint::spin_loop();
        }
        Ok(true)
    }

    fn idle_after_ns(&self) -> u64 {
        crate::emulated::IDLE_AFTER_NS
    }

    fn device_time_ns(&self) -> u64 {
        self.clock + self.clock_at.elapsed().as_nanos() as u64
    }

    fn stop(&mut self, globals: &SharedBuf) {
        // Release: nothing to publish before it; the slots poll it.
        globals.word(layout::at!(Globals.quit)).store(1, Ordering::Release);
        if let Some(s) = self.stream.as_ref() {
            let _ = s.wait(Duration::from_secs(5));
        }
    }
}
