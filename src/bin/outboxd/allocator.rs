//! The allocator's set-up for payload-sized buffers. glibc's malloc serves
//! a large block from its heap once a block that large has been freed (its
//! threshold for mapping blocks of their own moves up to 32 MiB), and memory
//! freed inside a heap stays with the process: after a few large payloads
//! the process kept the room of every copy any of them needed at once, on
//! whichever thread's heap, above the copies themselves. A fixed threshold
//! maps each block of a mebibyte or more on its own and gives it back when
//! it is freed. (musl, which the release binaries use, does so already.)

/// Blocks this large or larger are mapped on their own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: std::os::raw::c_int = 1 << 20;

/// Sets the threshold; call it first thing in `main`, before any thread.
pub(crate) fn set_up() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// glibc's `M_MMAP_THRESHOLD` (malloc.h).
        const M_MMAP_THRESHOLD: std::os::raw::c_int = -3;
        unsafe extern "C" {
            fn mallopt(
                param: std::os::raw::c_int,
                value: std::os::raw::c_int,
            ) -> std::os::raw::c_int;
        }
        // SAFETY: mallopt only sets a parameter of the allocator, and runs
        // before any other thread exists. Should it fail, the allocator
        // keeps its defaults, which are safe too.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
}
