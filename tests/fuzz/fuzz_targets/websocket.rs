//! WebSocket frames from a client, read as messages.
//! It may fail on any input, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nanolet::server::fuzzing::websocket_frames(data);
});
