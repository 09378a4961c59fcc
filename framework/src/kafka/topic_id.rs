//! A topic's ID (KIP-516): what tells a deleted and recreated changelog from the one a
//! transaction log was built from. Offsets cannot: a recreated topic that has grown past
//! the old checkpoint looks like the old one read further.
//!
//! rdkafka has no safe call for it. librdkafka's `DescribeTopics` admin call (since 2.3)
//! returns it, and this file calls it through rdkafka-sys: the engine's only unsafe code,
//! kept here, each pointer's owner and lifetime said where it is taken. Every object
//! librdkafka hands out is destroyed by a guard, on every path.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char};
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as ffi;
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use super::{ClientOptions, kafka_error};
use crate::blocking::blocking;
use crate::{Error, Result};

/// The ID of `topic` in base64 (as Kafka's tools print it), `None` when the topic does not
/// exist or the cluster gives topics no IDs (Kafka before 2.8).
pub(crate) async fn topic_id(
    options: &ClientOptions,
    topic: &str,
    timeout: Duration,
) -> Result<Option<String>> {
    let operation = crate::Operation::Other(format!("describe topic `{topic}`"));
    let admin: AdminClient<DefaultClientContext> = options
        .config(&[])
        .create()
        .map_err(|e| kafka_error(&operation, e))?;
    let topic = topic.to_owned();
    blocking("describe a topic", move || {
        describe(&admin, &topic, timeout).map_err(|(code, message)| Error::Kafka {
            operation,
            code: super::error::code_of(code),
            message,
            class: super::error::classify_code(code),
            cause: None,
        })
    })
    .await
}

/// Destroys what librdkafka handed out, whichever way [`describe`] returns.
struct Owned {
    names: *mut ffi::rd_kafka_TopicCollection_t,
    options: *mut ffi::rd_kafka_AdminOptions_t,
    queue: *mut ffi::rd_kafka_queue_t,
    event: *mut ffi::rd_kafka_event_t,
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: each pointer is null or was returned by its librdkafka constructor and
        // is destroyed exactly once, here; nothing borrowed from them outlives `describe`.
        unsafe {
            if !self.event.is_null() {
                ffi::rd_kafka_event_destroy(self.event);
            }
            if !self.queue.is_null() {
                ffi::rd_kafka_queue_destroy(self.queue);
            }
            if !self.options.is_null() {
                ffi::rd_kafka_AdminOptions_destroy(self.options);
            }
            if !self.names.is_null() {
                ffi::rd_kafka_TopicCollection_destroy(self.names);
            }
        }
    }
}

/// Blocking: asks the cluster for `topic`'s description and reads its ID from it.
fn describe(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    timeout: Duration,
) -> std::result::Result<Option<String>, (RDKafkaErrorCode, String)> {
    let name = CString::new(topic).map_err(|_| {
        (
            RDKafkaErrorCode::InvalidArgument,
            "a topic name with a NUL byte".into(),
        )
    })?;
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = admin.inner().native_ptr();
    let mut owned = Owned {
        names: std::ptr::null_mut(),
        options: std::ptr::null_mut(),
        queue: std::ptr::null_mut(),
        event: std::ptr::null_mut(),
    };
    // SAFETY: `rk` is the admin client's handle, alive for this whole function (`admin`
    // is borrowed). `name` outlives the call that copies it into the collection. Results
    // read from `owned.event` (descriptions, their names, IDs and errors) belong to the
    // event and are used before the guard destroys it.
    unsafe {
        let mut names = [name.as_ptr()];
        owned.names = ffi::rd_kafka_TopicCollection_of_topic_names(names.as_mut_ptr(), 1);
        owned.options = ffi::rd_kafka_AdminOptions_new(
            rk,
            ffi::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        let mut errstr = [0 as c_char; 256];
        let set = ffi::rd_kafka_AdminOptions_set_request_timeout(
            owned.options,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        if set != ffi::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let message = CStr::from_ptr(errstr.as_ptr())
                .to_string_lossy()
                .into_owned();
            return Err((set.into(), message));
        }
        owned.queue = ffi::rd_kafka_queue_new(rk);
        ffi::rd_kafka_DescribeTopics(rk, owned.names, owned.options, owned.queue);
        // The request's own timeout answers first; the margin only covers a lost answer.
        owned.event = ffi::rd_kafka_queue_poll(owned.queue, timeout_ms.saturating_add(5_000));
        if owned.event.is_null() {
            return Err((
                RDKafkaErrorCode::OperationTimedOut,
                format!("no answer within {timeout:?}"),
            ));
        }
        let code = ffi::rd_kafka_event_error(owned.event);
        if code != ffi::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let message = text(ffi::rd_kafka_event_error_string(owned.event));
            return Err((code.into(), message));
        }
        let result = ffi::rd_kafka_event_DescribeTopics_result(owned.event);
        if result.is_null() {
            return Err((RDKafkaErrorCode::Fail, "not a DescribeTopics result".into()));
        }
        let mut count = 0usize;
        let topics = ffi::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        for i in 0..count {
            let description = *topics.add(i);
            if text(ffi::rd_kafka_TopicDescription_name(description)) != topic {
                continue;
            }
            let error = ffi::rd_kafka_TopicDescription_error(description);
            if !error.is_null() {
                let code: RDKafkaErrorCode = ffi::rd_kafka_error_code(error).into();
                if code == RDKafkaErrorCode::UnknownTopicOrPartition {
                    return Ok(None);
                }
                if code != RDKafkaErrorCode::NoError {
                    return Err((code, text(ffi::rd_kafka_error_string(error))));
                }
            }
            let id = ffi::rd_kafka_TopicDescription_topic_id(description);
            if id.is_null()
                || (ffi::rd_kafka_Uuid_most_significant_bits(id) == 0
                    && ffi::rd_kafka_Uuid_least_significant_bits(id) == 0)
            {
                return Ok(None);
            }
            return Ok(Some(text(ffi::rd_kafka_Uuid_base64str(id))));
        }
        Ok(None)
    }
}

/// A C string librdkafka owns, copied (empty when null).
///
/// # Safety
/// `text` is null or a NUL-terminated string alive for this call.
unsafe fn text(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}
