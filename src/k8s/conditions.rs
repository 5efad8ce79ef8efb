//! Status conditions as Kubernetes and Karpenter write them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Set condition `type_` to `ok` with `reason` and `message`; its transition time moves only
/// when the status changes.
pub fn upsert_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    clock: &crate::clock::Clock,
) {
    let status = if ok { "True" } else { "False" };
    let cond = Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(clock.now()),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status && c.reason == reason && c.message == message => {}
        Some(c) => {
            let keep_time = c.status == status;
            let t = c.last_transition_time.clone();
            *c = cond;
            if keep_time {
                c.last_transition_time = t;
            }
        }
        None => conditions.push(cond),
    }
}
