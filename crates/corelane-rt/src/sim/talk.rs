//! The upgrade's connection between two simulated processes: words (and the hand-over) in
//! memory, each heard once its lag has passed on the virtual clock, and, where the seed says,
//! heard twice.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::Error;
use crate::clock::Clock;
use crate::host::{Heard, Talk, UpgradeOffer};
use crate::upgrade_words::Word;

/// What one end has been sent and not yet heard.
#[derive(Default)]
struct Inbox {
    words: VecDeque<(Instant, String)>,
    handover: Option<(Instant, Vec<UpgradeOffer>, String)>,
    /// The other end has closed: heard once the words before it are.
    closed: Option<Instant>,
}

/// One end of the connection.
pub(crate) struct MemTalk {
    boxes: Rc<RefCell<[Inbox; 2]>>,
    me: usize,
    clock: Clock,
    /// How long what this end says takes to be heard.
    lag: Duration,
    /// Every word this end says is heard twice.
    twice: bool,
    closed: bool,
}

/// A connection: the old process's end, then the new one's.
pub(crate) fn pair(clock: &Clock, lag: [Duration; 2], twice: [bool; 2]) -> (MemTalk, MemTalk) {
    let boxes = Rc::new(RefCell::new([Inbox::default(), Inbox::default()]));
    let end = |me: usize| MemTalk {
        boxes: boxes.clone(),
        me,
        clock: clock.clone(),
        lag: lag[me],
        twice: twice[me],
        closed: false,
    };
    (end(0), end(1))
}

impl MemTalk {
    /// Ends the connection from this side (as a process's end closes its socket).
    pub(crate) fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            let at = self.clock.now() + self.lag;
            self.boxes.borrow_mut()[1 - self.me].closed = Some(at);
        }
    }

    /// The hand-over, once it has arrived: the offers and the extras' text.
    pub(crate) fn take_handover(&mut self) -> Option<(Vec<UpgradeOffer>, String)> {
        let now = self.clock.now();
        let mut b = self.boxes.borrow_mut();
        let inbox = &mut b[self.me];
        if inbox.handover.as_ref().is_some_and(|h| h.0 <= now) {
            return inbox.handover.take().map(|(_, o, e)| (o, e));
        }
        None
    }

    /// Whether the other end has closed and everything it said was heard.
    pub(crate) fn ended(&self) -> bool {
        let now = self.clock.now();
        let b = self.boxes.borrow();
        let inbox = &b[self.me];
        inbox.words.is_empty() && inbox.closed.is_some_and(|t| t <= now)
    }
}

impl Drop for MemTalk {
    fn drop(&mut self) {
        self.close();
    }
}

impl Talk for MemTalk {
    fn say(&mut self, word: &Word) -> std::io::Result<()> {
        // Through the text, as over the socket: what one side writes the other reads back.
        let word = word.to_text();
        if self.closed || self.boxes.borrow()[self.me].closed.is_some() {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let at = self.clock.now() + self.lag;
        let mut b = self.boxes.borrow_mut();
        let other = &mut b[1 - self.me];
        other.words.push_back((at, word.to_string()));
        if self.twice {
            other.words.push_back((at, word.to_string()));
        }
        Ok(())
    }

    fn hear(&mut self) -> Heard {
        let now = self.clock.now();
        let mut b = self.boxes.borrow_mut();
        let inbox = &mut b[self.me];
        if inbox.words.front().is_some_and(|w| w.0 <= now) {
            return inbox
                .words
                .pop_front()
                .map_or(Heard::Nothing, |(_, w)| Heard::Word(Word::parse(&w)));
        }
        if inbox.words.is_empty() && inbox.closed.is_some_and(|t| t <= now) {
            return Heard::Ended;
        }
        Heard::Nothing
    }

    fn hand_over(
        &mut self,
        program: Option<crate::host::SteeringShare>,
        offers: Vec<UpgradeOffer>,
        extras: &str,
    ) -> Result<(), Error> {
        // The in-memory program is the same object for both processes: nothing to send.
        drop(program);
        if self.closed || self.boxes.borrow()[self.me].closed.is_some() {
            return Err(Error::Io(std::io::ErrorKind::BrokenPipe.into()));
        }
        let at = self.clock.now() + self.lag;
        self.boxes.borrow_mut()[1 - self.me].handover = Some((at, offers, extras.to_string()));
        Ok(())
    }
}
