//! How shared memory crosses the system-call boundary.
//!
//! Most of what a call answers is plain data. A few replies also hand out shared memory:
//! an allocation's CPU mapping (`map_allocation`), a queue's kernel page (`create_hw_queue`),
//! a fence's CurrentValue page (`create_native_fence` and the fence opens), and a doorbell's
//! pages (`create_doorbell`, `connect_doorbell`). Shared memory is not bytes: in one process
//! it is a mapping ([`shm::Mapping`], [`shm::RotatingPage`]); across the daemon's socket it
//! is a file descriptor passed with `SCM_RIGHTS` beside the frame that names it. So the types
//! that carry it are generic over a [`Memory`], which says what each kind of shared memory is
//! in one representation: [`Local`] in-process (what every port answers), `wire::Fds` on the
//! socket (descriptors by index).
//!
//! A [`Translate`] turns one representation into another, slot by slot, and
//! [`Reply::translate`](crate::port::Reply::translate) walks a reply with it, leaving the
//! plain data as it is: the daemon translates the kernel's [`Local`] reply into descriptors
//! to send, the client translates what it received back into mappings, and neither end
//! spells out the replies that carry no memory.

use std::sync::Arc;

/// What each kind of shared memory a reply hands out is, in one representation.
pub trait Memory {
    /// A CPU mapping: an allocation, a queue's kernel page, a fence's CurrentValue page.
    type Mapping;
    /// A doorbell's CPU page, as `create_doorbell` hands it out (`DoorbellCPUVirtualAddress`).
    type DoorbellPage;
    /// The process's aggregated doorbell page.
    type AggregatedPage;
    /// What `connect_doorbell` hands out.
    type Connected;
}

/// Shared memory in one process: what every port answers (the default of every type that
/// carries memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Local;

impl Memory for Local {
    /// Mapped here, from a descriptor (so it can also be passed to another process).
    type Mapping = shm::Mapping;
    /// The page the kernel rotates between the BAR and a dummy page (spec 000): the client
    /// writes its doorbell word there, whatever the page shows now.
    type DoorbellPage = Arc<shm::RotatingPage>;
    /// Never rotated while the process lives (to a dummy page when it ends).
    type AggregatedPage = Arc<shm::RotatingPage>;
    /// Nothing: the kernel rotated the page `create_doorbell` handed out.
    type Connected = ();
}

/// Turns the shared memory of one representation into another's, one slot at a time (see
/// the module docs). An end that translates holds what it needs besides (the descriptors of
/// a frame, the call being answered).
pub trait Translate<From: Memory, To: Memory> {
    /// Why a slot could not be translated.
    type Error;
    /// A CPU mapping.
    fn mapping(&mut self, m: From::Mapping) -> Result<To::Mapping, Self::Error>;
    /// A doorbell's CPU page.
    fn doorbell_page(&mut self, page: From::DoorbellPage) -> Result<To::DoorbellPage, Self::Error>;
    /// The aggregated doorbell page; `None`: it cannot be carried (it shows no page the other
    /// side could ring), and the doorbell is handed out without it.
    fn aggregated_page(&mut self, page: From::AggregatedPage) -> Result<Option<To::AggregatedPage>, Self::Error>;
    /// What a connect hands out.
    fn connected(&mut self, connected: From::Connected) -> Result<To::Connected, Self::Error>;
}
