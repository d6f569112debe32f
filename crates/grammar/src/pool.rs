//! The threads that compile grammars: a few, with a large stack (only reserved address space
//! until used), fed by a bounded queue. Each job runs under `catch_unwind`; its caller waits for
//! it to start and then to end, each within the deadline, and gives up past it (the thread
//! finishes in the background, bounded by llguidance's fuel, and its result is dropped).

use crate::GrammarError;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Job = Box<dyn FnOnce() + Send>;

/// Whether the caller of a job gave up on it.
#[derive(Debug, Default)]
pub(crate) struct Abandoned(AtomicBool);

impl Abandoned {
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

enum Message<T> {
    Started,
    Done(Result<T, String>),
}

/// The compile threads and their queue.
pub(crate) struct Pool {
    jobs: SyncSender<Job>,
    queue: usize,
    deadline: Duration,
}

impl Pool {
    /// `threads` threads of `stack_bytes` each, taking jobs from a queue of `queue` places.
    pub(crate) fn new(
        threads: usize,
        stack_bytes: usize,
        queue: usize,
        deadline: Duration,
    ) -> Result<Self, GrammarError> {
        let (jobs, rx) = sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("grammar-compile-{i}"))
                .stack_size(stack_bytes)
                .spawn(move || work(&rx))
                .map_err(|e| {
                    GrammarError::Unavailable(format!("cannot start a compile thread: {e}"))
                })?;
        }
        Ok(Self {
            jobs,
            queue,
            deadline,
        })
    }

    /// Runs `f` on a compile thread and waits for it: an error if the queue is full or the job
    /// does not start within the deadline (overloaded), if it does not end within the deadline
    /// once started, or if it panics. `f` is told whether its caller has given up.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Abandoned) -> T + Send + 'static,
    ) -> Result<T, GrammarError> {
        let abandoned = Arc::new(Abandoned::default());
        let (tx, rx) = sync_channel(2);
        let flag = abandoned.clone();
        let job: Job = Box::new(move || {
            if flag.get() || tx.send(Message::Started).is_err() {
                return;
            }
            let result = catch_unwind(AssertUnwindSafe(|| f(&flag))).map_err(panic_message);
            let _ = tx.send(Message::Done(result));
        });
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(GrammarError::Overloaded(self.queue)),
            Err(TrySendError::Disconnected(_)) => {
                return Err(GrammarError::Unavailable(
                    "the compile threads are gone".into(),
                ));
            }
        }
        let give_up = |error| {
            abandoned.set();
            Err(error)
        };
        let done = match rx.recv_timeout(self.deadline) {
            Ok(Message::Started) => match rx.recv_timeout(self.deadline) {
                Ok(Message::Done(done)) => done,
                Ok(Message::Started) | Err(RecvTimeoutError::Disconnected) => {
                    return give_up(gone());
                }
                Err(RecvTimeoutError::Timeout) => {
                    return give_up(GrammarError::Deadline(self.deadline));
                }
            },
            Ok(Message::Done(done)) => done,
            Err(RecvTimeoutError::Timeout) => return give_up(GrammarError::Overloaded(self.queue)),
            Err(RecvTimeoutError::Disconnected) => return give_up(gone()),
        };
        done.map_err(GrammarError::Panicked)
    }
}

fn gone() -> GrammarError {
    GrammarError::Unavailable("a compile thread ended without an answer".into())
}

/// A thread's loop: the next job, until the pool is dropped.
fn work(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            // A panic never happens while the lock is held (jobs run after it is released).
            let rx = jobs.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// A job that says it started, then waits to be released (sent again while the pool's
    /// thread is not yet waiting for jobs).
    fn blocker(pool: &Arc<Pool>) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (release, wait) = channel::<()>();
        let wait = Arc::new(Mutex::new(wait));
        let (started, is_started) = channel();
        let pool = pool.clone();
        let handle = std::thread::spawn(move || {
            loop {
                let (started, wait) = (started.clone(), wait.clone());
                let run = pool.run(move |_| {
                    started.send(()).unwrap();
                    let _ = wait.lock().unwrap().recv();
                });
                if run != Err(GrammarError::Overloaded(pool.queue)) {
                    return;
                }
                std::thread::yield_now();
            }
        });
        is_started.recv().unwrap();
        (release, handle)
    }

    #[test]
    fn a_job_runs_on_a_big_stack_and_a_panic_is_an_error() {
        let pool = Pool::new(1, 64 << 20, 4, Duration::from_secs(30)).unwrap();
        // 16 MiB of locals: past a default thread's 2 MiB.
        let deep = pool.run(|_| {
            let big = [7u8; 16 << 20];
            std::hint::black_box(&big)[12345]
        });
        assert_eq!(deep, Ok(7));
        let panicked = pool.run(|_| -> u8 { panic!("the compiler broke") });
        assert_eq!(
            panicked,
            Err(GrammarError::Panicked("the compiler broke".into()))
        );
        assert_eq!(pool.run(|_| 3), Ok(3), "the thread survives a panic");
    }

    #[test]
    fn a_full_queue_is_overloaded_at_once() {
        let pool = Arc::new(Pool::new(1, 1 << 20, 0, Duration::from_secs(30)).unwrap());
        let (release, handle) = blocker(&pool);
        assert_eq!(pool.run(|_| 1), Err(GrammarError::Overloaded(0)));
        release.send(()).unwrap();
        handle.join().unwrap();
    }

    #[test]
    fn past_the_deadline_the_caller_gives_up_and_a_queued_job_never_runs() {
        let deadline = Duration::from_millis(500);
        let pool = Arc::new(Pool::new(1, 1 << 20, 1, deadline).unwrap());
        // Running past the deadline.
        let (release, wait) = channel::<()>();
        let (told, abandoned) = channel();
        let slow = pool.run(move |flag| {
            let _ = wait.recv();
            told.send(flag.get()).unwrap();
        });
        assert_eq!(slow, Err(GrammarError::Deadline(deadline)));
        release.send(()).unwrap();
        assert!(
            abandoned.recv().unwrap(),
            "the job is told its caller gave up"
        );
        // Waiting past the deadline behind a busy thread.
        let (release, handle) = blocker(&pool);
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let queued = pool.run(move |_| flag.store(true, Ordering::Relaxed));
        assert_eq!(queued, Err(GrammarError::Overloaded(1)));
        release.send(()).unwrap();
        handle.join().unwrap();
        // The thread takes the abandoned job (and skips it) once it is free: until then the
        // queue may still be full, as a client retrying after a 503 would find.
        let t0 = std::time::Instant::now();
        let after = loop {
            match pool.run(|_| 5) {
                Err(GrammarError::Overloaded(_)) if t0.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                other => break other,
            }
        };
        assert_eq!(after, Ok(5));
        assert!(!ran.load(Ordering::Relaxed), "an abandoned job is skipped");
    }
}
