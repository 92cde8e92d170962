//! The OpenAPI document, generated from the handlers' annotations.

use utoipa::OpenApi;

use crate::native::{
    accounting, activity, advisor, approvals, archive, audit, checkpoints, events, fanout, files, images, metrics,
    network, patching, pipelines, policy, preview, processes, quarantine, quotas, sandboxes, scan, standby, templates,
    tenancy,
};

/// strata's native HTTP API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "strata",
        description = "Sandbox runtime for multi-step AI-agent pipelines: native HTTP API. Over TCP, send `Authorization: Bearer <token>`: the operator's token (`<state-dir>/api-token`, every tenant) or a tenant token from `POST /v1/tokens` (its tenant's sandboxes, checkpoints, templates and pipeline runs only; another tenant's ids are 404 like unknown ones; operator-only routes are 403). The operator may send `X-Strata-Tenant: T` to act as tenant T. A request that would give one sandbox all three Rule-of-Two capabilities (untrusted_input, sensitive_access, external_comms) is refused with 403 `approval_required` and a pending approval; once an operator approves it, repeat the request (optionally with `X-Strata-Approval: <id>`). Errors are JSON `ApiErrorBody` with a machine-readable `code`. Preview URLs (`/preview/<sandbox>/<port>/...`, or the Host `<port>-<sandbox>.<preview-domain>`) are proxied to the sandbox before any of this: they take a preview token (`X-Strata-Preview-Token`, `?strata_token=`, or the cookie a signed URL sets), not a bearer token."
    ),
    paths(
        sandboxes::create_handler,
        sandboxes::list_handler,
        sandboxes::get_handler,
        sandboxes::stop_handler,
        sandboxes::start_handler,
        sandboxes::remove_handler,
        standby::pause_handler,
        standby::unpause_handler,
        standby::standby_handler,
        standby::resume_handler,
        archive::archive_handler,
        network::get_handler,
        network::put_handler,
        policy::update_handler,
        activity::create_lease_handler,
        activity::list_leases_handler,
        activity::renew_lease_handler,
        activity::release_lease_handler,
        processes::exec_handler,
        processes::start_process_handler,
        processes::list_processes_handler,
        processes::get_process_handler,
        processes::logs_handler,
        processes::signal_handler,
        processes::stdin_handler,
        processes::resize_handler,
        processes::tty_handler,
        processes::wait_handler,
        files::download_handler,
        files::upload_handler,
        files::stat_handler,
        files::list_handler,
        files::watch_handler,
        files::mkdir_handler,
        files::remove_handler,
        files::move_handler,
        images::import_handler,
        images::pull_handler,
        images::list_handler,
        images::get_handler,
        images::remove_handler,
        checkpoints::create_handler,
        checkpoints::list_for_sandbox_handler,
        checkpoints::list_handler,
        checkpoints::get_handler,
        checkpoints::delete_handler,
        checkpoints::fork_handler,
        checkpoints::restore_handler,
        checkpoints::diff_handler,
        checkpoints::export_handler,
        checkpoints::gc_handler,
        checkpoints::lineage_handler,
        templates::create_handler,
        templates::list_handler,
        templates::delete_handler,
        templates::policy_handler,
        templates::check_handler,
        templates::build_handler,
        events::events_handler,
        events::info_handler,
        events::doctor_handler,
        events::warm_pool_handler,
        metrics::metrics_handler,
        accounting::list_handler,
        accounting::stats_handler,
        accounting::get_handler,
        advisor::advise_handler,
        scan::scan_handler,
        patching::versions_handler,
        patching::outdated_handler,
        patching::rebase_handler,
        patching::rebuild_handler,
        quarantine::place_handler,
        quarantine::lift_handler,
        quarantine::list_handler,
        quarantine::check_handler,
        quarantine::accumulation_handler,
        audit::list_handler,
        audit::verify_handler,
        fanout::fanout_handler,
        pipelines::create_handler,
        pipelines::list_handler,
        pipelines::get_handler,
        pipelines::resume_handler,
        pipelines::pause_handler,
        pipelines::cost_handler,
        tenancy::create_token_handler,
        tenancy::list_tokens_handler,
        tenancy::revoke_token_handler,
        quotas::get_quota_handler,
        quotas::put_quota_handler,
        quotas::delete_quota_handler,
        quotas::usage_handler,
        approvals::list_handler,
        approvals::get_handler,
        approvals::approve_handler,
        approvals::deny_handler,
        preview::create_handler,
        preview::list_handler,
        preview::revoke_handler,
    ),
    components(schemas(
        strata_api::ApiErrorBody,
        strata_api::ErrorCode,
        strata_api::ProcessEvent,
        strata_api::ImportEvent,
        strata_api::SandboxState,
        strata_api::Finding,
        strata_api::Severity,
        strata_api::PipelineEvent,
        strata_api::QuotaValue
    ))
)]
pub struct ApiDoc;

/// The spec as pretty JSON (what `/openapi.json` serves and docs/openapi.json holds).
pub fn spec_json() -> String {
    ApiDoc::openapi().to_pretty_json().expect("OpenAPI serializes")
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_spec_matches_the_code() {
        let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json"))
            .unwrap_or_default();
        let generated = super::spec_json();
        assert!(
            committed.trim() == generated.trim(),
            "docs/openapi.json is out of date: run `cargo run -p strata -- openapi > docs/openapi.json`"
        );
    }
}
