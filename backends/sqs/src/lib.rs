//! # ferriq-sqs
//!
//! The SQS broker of DESIGN §7 (long-poll receive, batched sends, visibility heartbeats within
//! the 12 h budget, a dead-letter queue with reasons) is **not built yet**: this crate only
//! holds its place in the workspace layout (DESIGN §2). No issue for it was open in the session
//! that created the workspace; until one lands, use `ferriq-amqp` or the in-memory broker.
