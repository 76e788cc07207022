//! What Reservoir's test suites share for the processes they run
//! (`reservoir serve`, `reservoir-replay`, Kafka's own tools): waits with a
//! limit. A child that does not finish in time has every thread's stack
//! printed (by gdb, when the machine has it) with the last lines it logged,
//! is killed, and fails the test that waited, so a hang costs a test its
//! limit and says where it hung, instead of stalling the whole run until CI's
//! budget ends with nothing to go on. And the port of a process a test
//! killed, held so that nothing else answers on it ([`DeadPort`]).
//!
//! A dev-dependency only: nothing here ships.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStderr, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits for a child to exit after asking it to (SIGTERM),
/// or for a one-shot command to finish: far beyond any healthy run's seconds.
pub const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// Lines of a child's stderr kept to show when it hangs.
const TAIL_LINES: usize = 60;

/// The last lines a child wrote to stderr, kept while a thread drains the pipe
/// (so the child never blocks on a full pipe).
#[derive(Clone, Default)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    /// Drains `stderr` on its own thread, calling `each` with every line.
    pub fn follow(stderr: ChildStderr, mut each: impl FnMut(&str) + Send + 'static) -> StderrTail {
        let tail = StderrTail::default();
        let kept = tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                each(&line);
                kept.push(line);
            }
        });
        tail
    }

    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        let lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().cloned().collect()
    }
}

/// Waits for `child` to exit, at most `limit`. Past it: prints the child's
/// thread stacks and `tail`, kills it, and panics naming `what`.
pub fn wait_bounded(
    child: &mut Child,
    what: &str,
    limit: Duration,
    tail: Option<&StderrTail>,
) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => hung(child, what, limit, tail),
            Err(err) => panic!("{what}: cannot wait for pid {}: {err}", child.id()),
        }
    }
}

/// Sends SIGTERM and waits for the exit, as [`wait_bounded`] does.
pub fn terminate(child: &mut Child, what: &str, tail: Option<&StderrTail>) -> ExitStatus {
    // SAFETY: kill takes no pointers; a child that already exited is reaped below.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    wait_bounded(child, what, EXIT_LIMIT, tail)
}

/// Runs `command` to completion like [`Command::output`], at most `limit`.
pub fn output_bounded(command: &mut Command, what: &str, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_bounded(&mut child, what, limit, None);
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

fn hung(child: &mut Child, what: &str, limit: Duration, tail: Option<&StderrTail>) -> ! {
    let pid = child.id();
    eprintln!("=== {what} (pid {pid}) still running after {limit:?}; its threads:");
    match Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt 30"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => eprintln!("{}", String::from_utf8_lossy(&out.stdout)),
        Err(err) => eprintln!("(no stacks: gdb: {err})"),
    }
    if let Some(tail) = tail {
        eprintln!("=== the last lines it logged:");
        for line in tail.lines() {
            eprintln!("{line}");
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} (pid {pid}) did not finish within {limit:?}; stacks above");
}

/// The port of a process a test killed, held for as long as this lives:
/// bound, never listening, so a connection to it is refused at once, as to
/// a process that is gone. Without it the kernel may give the freed port to
/// another test's listener (tests run in parallel), and a request meant to
/// find no one reaches a server that answers, or one that never does: a
/// client test's reserve that should have fallen back to a shard once timed
/// out instead.
pub struct DeadPort {
    _socket: tokio::net::TcpSocket,
}

impl DeadPort {
    /// Takes `addr`'s port; call it right after the process was reaped.
    /// The port was seen taken for a moment right after its listener closed
    /// (once, in this crate's own test under load; the likely cause, not
    /// shown: a child a parallel test was spawning held a copy of the
    /// listener's descriptor until it exec'd), so this tries for a while.
    pub fn hold(addr: SocketAddr) -> DeadPort {
        let started = Instant::now();
        loop {
            match Self::bind(addr) {
                Ok(socket) => return DeadPort { _socket: socket },
                Err(e) if started.elapsed() > Duration::from_secs(5) => {
                    panic!("{addr}, a dead process's port, stayed taken: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
        let socket = match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }?;
        // The dead process's closed connections may sit in TIME_WAIT. With
        // SO_REUSEADDR a listener that names the port and sets it too could
        // still bind it (one without it cannot: the test below); Linux gives
        // one that asks for any port (port 0, as every test's does) a port
        // no socket holds.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        Ok(socket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_port_held_refuses_connections() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let early = std::net::TcpStream::connect(addr).expect("a live listener");
        drop((early, listener)); // the process is gone
        let held = DeadPort::hold(addr);
        let refused = std::net::TcpStream::connect(addr).expect_err("nobody listens");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        // Refused would hold for a port merely freed too; what the hold adds
        // is that the port is taken.
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        let taken = other.bind(addr).expect_err("the port is held");
        assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse);
        drop(held);
    }

    #[test]
    fn a_finished_command_gives_its_output() {
        let out = output_bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            "sh",
            EXIT_LIMIT,
        );
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn a_command_past_its_limit_is_killed_and_fails_the_waiter() {
        let started = Instant::now();
        let hung = std::panic::catch_unwind(|| {
            output_bounded(
                Command::new("sleep").arg("30"),
                "sleep",
                Duration::from_millis(200),
            )
        });
        let message = *hung
            .expect_err("a hang fails")
            .downcast::<String>()
            .unwrap();
        assert!(message.contains("did not finish within"), "{message}");
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "killed, not waited out"
        );
    }
}
