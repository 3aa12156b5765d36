//! Empty library target: lets `gateway-daemon` declare a build-dependency on this
//! crate so cargo rebuilds the daemon when the kernel program changes.
#![no_std]
