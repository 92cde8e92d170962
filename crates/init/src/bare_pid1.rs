//! Pid 1 of a namespace-tier sandbox, before the C library starts.
//!
//! Every idle sandbox keeps one pid 1. Started the usual way, the C library and
//! Rust's runtime write to about 60 KiB of pages of their own at start-up
//! (relocations, stdio, malloc's arena, thread-local storage, the heap), and
//! those pages stay resident and private to each sandbox for its whole life.
//! This binary's ELF entry point is [`strata_init_entry`]: when it is started
//! as `strata _pid1 GRACE_SECS` (exactly that; the gVisor tier's
//! `_pid1 GRACE --spawner` and every other command take the normal path) it
//! runs pid 1's loop right there on raw system calls, with nothing but its
//! stack written; otherwise it jumps to the C library's `_start`, as if nothing
//! had happened.
//!
//! What runs here must not touch the C library or Rust's runtime, which are
//! not initialised: no allocation, no thread-locals, no panics (the code uses
//! no indexing that can fail and no formatting), no calls the compiler may
//! turn into `memcpy`/`memset` (buffers are left uninitialised and copied byte
//! by byte). `scripts/build-init.sh` checks the compiled function for calls
//! and `%fs` accesses.
//!
//! Behaviour is that of [`strata_init::pid1::pid1_main`] without `--spawner`:
//! not dumpable, stdio on /dev/null, credentials dropped to root with only
//! CAP_KILL, no_new_privs, then reap every child; on SIGTERM or SIGINT send
//! SIGTERM to every process and exit once they are gone or the grace period
//! has passed (the kernel then kills whatever is left).

#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use core::arch::{asm, global_asm};
use core::mem::MaybeUninit;

// The entry point. At entry the kernel has put argc at [rsp] and argv after it,
// rsp is 16-byte aligned, and rdx holds the dynamic loader's exit hook (0 for a
// static binary): rdx is kept for `_start`, which hands it to the C library.
global_asm!(
    ".globl strata_init_entry",
    ".type strata_init_entry,@function",
    "strata_init_entry:",
    "push rdx",
    "sub rsp, 8",
    "lea rdi, [rsp + 16]",
    "call {check}",
    "add rsp, 8",
    "pop rdx",
    "jmp _start",
    check = sym bare_pid1_or_return,
);

/// Runs pid 1 (never returns) when the process was started as `_pid1 GRACE`;
/// returns otherwise. `sp` points at argc.
///
/// # Safety
///
/// `sp` must be the process's initial stack pointer (argc, argv..., NULL).
#[no_mangle]
unsafe extern "C" fn bare_pid1_or_return(sp: *const usize) {
    // SAFETY: the kernel's initial stack: argc, then argc pointers to C strings.
    let (argc, argv) = unsafe { (*sp, sp.add(1) as *const *const u8) };
    if argc != 3 {
        return;
    }
    // SAFETY: argv[1] and argv[2] exist (argc == 3) and are NUL-terminated.
    let (cmd, grace) = unsafe { (*argv.add(1), *argv.add(2)) };
    // SAFETY: as above.
    if !unsafe { c_str_is(cmd, b"_pid1") } {
        return;
    }
    // SAFETY: as above.
    let grace = unsafe { parse_secs(grace) }.unwrap_or(10);
    pid1(grace)
}

/// Whether the C string at `s` is exactly `want`.
///
/// # Safety
///
/// `s` must point at a NUL-terminated string.
unsafe fn c_str_is(s: *const u8, want: &[u8]) -> bool {
    let mut i = 0;
    while i < want.len() {
        // SAFETY: every byte up to and including the first NUL may be read; we stop at a mismatch (the NUL included).
        let b = unsafe { core::ptr::read_volatile(s.add(i)) };
        if Some(&b) != want.get(i) {
            return false;
        }
        i += 1;
    }
    // SAFETY: the bytes before matched `want`, none of them NUL: this one is in the string.
    unsafe { core::ptr::read_volatile(s.add(i)) == 0 }
}

/// Decimal seconds (1-19 digits), else `None`.
///
/// # Safety
///
/// `s` must point at a NUL-terminated string.
unsafe fn parse_secs(s: *const u8) -> Option<u64> {
    let mut v: u64 = 0;
    let mut i = 0;
    loop {
        // SAFETY: reading stops at the NUL.
        let b = unsafe { core::ptr::read_volatile(s.add(i)) };
        match b {
            0 if i > 0 => return Some(v),
            b'0'..=b'9' if i < 19 => v = v * 10 + u64::from(b - b'0'),
            _ => return None,
        }
        i += 1;
    }
}

fn pid1(grace: u64) -> ! {
    const CAP_KILL: u32 = 5;
    prctl(libc::PR_SET_DUMPABLE, 0);
    // stdio on /dev/null (the namespace tier's set-up did so already; kept for any other caller).
    let null = sys(
        libc::SYS_openat,
        [libc::AT_FDCWD as usize, c"/dev/null".as_ptr() as usize, (libc::O_RDWR | libc::O_CLOEXEC) as usize, 0, 0, 0],
    );
    if null >= 0 {
        for fd in 0..3 {
            sys(libc::SYS_dup2, [null as usize, fd, 0, 0, 0, 0]);
        }
        sys(libc::SYS_close, [null as usize, 0, 0, 0, 0, 0]);
    }
    // Credentials: root of the sandbox with CAP_KILL only (to signal every process when stopping).
    for cap in 0..64 {
        if cap != CAP_KILL as usize {
            // Unknown to the running kernel: EINVAL, nothing to drop.
            prctl(libc::PR_CAPBSET_DROP, cap);
        }
    }
    let groups: [u32; 1] = [0];
    sys(libc::SYS_setgroups, [1, groups.as_ptr() as usize, 0, 0, 0, 0]);
    sys(libc::SYS_setresgid, [0, 0, 0, 0, 0, 0]);
    sys(libc::SYS_setresuid, [0, 0, 0, 0, 0, 0]);
    sys(libc::SYS_prctl, [libc::PR_CAP_AMBIENT as usize, libc::PR_CAP_AMBIENT_CLEAR_ALL as usize, 0, 0, 0, 0]);
    let header = CapHeader { version: 0x2008_0522, pid: 0 }; // _LINUX_CAPABILITY_VERSION_3
    let kill = 1u32 << CAP_KILL;
    let data = [
        CapData { effective: kill, permitted: kill, inheritable: kill },
        CapData { effective: 0, permitted: 0, inheritable: 0 },
    ];
    sys(libc::SYS_capset, [&header as *const CapHeader as usize, data.as_ptr() as usize, 0, 0, 0, 0]);
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1);
    reap_loop(grace)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn reap_loop(grace: u64) -> ! {
    let mut set: u64 = 0;
    for s in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGALRM] {
        set |= 1 << (s - 1);
    }
    sys(libc::SYS_rt_sigprocmask, [libc::SIG_BLOCK as usize, &set as *const u64 as usize, 0, 8, 0, 0]);
    let mut stopping = false;
    loop {
        // While stopping, poll: processes started by `strata exec` are not pid 1's
        // children, so their exit sends no SIGCHLD here.
        let poll = Timespec { sec: 0, nsec: 50_000_000 };
        let timeout = if stopping { &poll as *const Timespec as usize } else { 0 };
        let sig = sys(libc::SYS_rt_sigtimedwait, [&set as *const u64 as usize, 0, timeout, 8, 0, 0]);
        if sig == libc::SIGTERM as isize || sig == libc::SIGINT as isize {
            if !stopping {
                stopping = true;
                sys(libc::SYS_kill, [-1isize as usize, libc::SIGTERM as usize, 0, 0, 0, 0]);
                sys(libc::SYS_alarm, [grace.clamp(1, 3600) as usize, 0, 0, 0, 0, 0]);
            }
        } else if sig == libc::SIGALRM as isize && stopping {
            exit(0);
        }
        loop {
            let r = sys(libc::SYS_wait4, [-1isize as usize, 0, (libc::WNOHANG | libc::__WALL) as usize, 0, 0, 0]);
            if r > 0 {
                continue;
            }
            if r == -(libc::ECHILD as isize) && stopping && no_other_processes() {
                exit(0);
            }
            break;
        }
        if stopping && no_other_processes() {
            exit(0);
        }
    }
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

/// True when pid 1 is the only process left in its pid namespace (also when /proc cannot be read).
fn no_other_processes() -> bool {
    let dir = sys(
        libc::SYS_openat,
        [
            libc::AT_FDCWD as usize,
            c"/proc".as_ptr() as usize,
            (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as usize,
            0,
            0,
            0,
        ],
    );
    if dir < 0 {
        return true;
    }
    let mut buf = MaybeUninit::<[u8; 2048]>::uninit();
    let mut alone = true;
    'read: loop {
        let n = sys(libc::SYS_getdents64, [dir as usize, buf.as_mut_ptr() as usize, 2048, 0, 0, 0]);
        if n <= 0 {
            break;
        }
        let base = buf.as_ptr() as *const u8;
        let mut off = 0usize;
        // struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name (NUL-terminated) at 19.
        while off + 19 < n as usize {
            // SAFETY: the kernel wrote `n` bytes of whole records; reclen is at 16 and the name at 19 of each.
            let (reclen, pid) = unsafe {
                let r = core::ptr::read_unaligned(base.add(off + 16) as *const u16) as usize;
                (r, parse_pid(base.add(off + 19)))
            };
            if pid.is_some_and(|p| p != 1) {
                alone = false;
                break 'read;
            }
            if reclen == 0 {
                break;
            }
            off += reclen;
        }
    }
    sys(libc::SYS_close, [dir as usize, 0, 0, 0, 0, 0]);
    alone
}

/// A directory name that is a pid.
///
/// # Safety
///
/// `s` must point at a NUL-terminated string.
unsafe fn parse_pid(s: *const u8) -> Option<u64> {
    // SAFETY: the caller's contract.
    unsafe { parse_secs(s) }
}

fn prctl(option: i32, arg: usize) -> isize {
    sys(libc::SYS_prctl, [option as usize, arg, 0, 0, 0, 0])
}

fn exit(code: i32) -> ! {
    sys(libc::SYS_exit_group, [code as usize, 0, 0, 0, 0, 0]);
    // exit_group does not return.
    loop {
        core::hint::spin_loop();
    }
}

/// A raw system call: the result, or `-errno`.
fn sys(nr: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the x86_64 Linux system call convention; every caller passes
    // pointers only to memory that lives across the call.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}
