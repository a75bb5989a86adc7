//! The OS's calls and the sequences that cross concerns: each file is one seam of the spec,
//! a set of `impl Os` methods that run the owners (`super::doorbells`, `super::fences`, …) in
//! the spec's order, passing them what they share. Nothing here is imported by the owners or
//! by [`super::Os`]'s module: the calls sit on top.

mod doorbells;
mod fences;
mod hang;
mod isr;
mod migrate;
mod objects;
mod power;
mod preempt;
mod queues;
mod submit;
mod tdr;
mod userq;
mod waits;
mod watchdog;
