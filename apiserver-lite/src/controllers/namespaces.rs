//! Namespace lifecycle and service accounts, as kube-controller-manager runs them: a
//! terminating namespace is emptied, then removed; every active namespace has a `default`
//! ServiceAccount (re-created when deleted).

use api::kinds::serviceaccount::DEFAULT as DEFAULT_SERVICE_ACCOUNT;
use api::Kind;
use serde_json::json;

use super::write::ns_name;
use crate::error::ApiError;
use crate::registry::{DeleteOptions, Registry, WriteOptions};

/// Empties terminating namespaces, then removes them.
pub(crate) async fn namespace_lifecycle(reg: &Registry) -> Result<(), ApiError> {
    let (namespaces, _) = reg.store.list(Kind::Namespace, None)?;
    for n in namespaces {
        if n["metadata"].get("deletionTimestamp").is_none() {
            continue;
        }
        let (_, ns) = ns_name(&n);
        let mut remaining = 0;
        let custom = reg.crds.all().into_iter().map(|(c, _)| Kind::Custom(c));
        let kinds: Vec<Kind> = Kind::ALL.iter().copied().chain(custom).filter(|k| k.info().namespaced).collect();
        for kind in kinds {
            let (items, _) = reg.store.list(kind, Some(&ns))?;
            for item in items {
                remaining += 1;
                if item["metadata"].get("deletionTimestamp").is_some() {
                    continue;
                }
                let (_, name) = ns_name(&item);
                match reg.delete(kind, Some(&ns), &name, &DeleteOptions::default()).await {
                    Ok(_) | Err(ApiError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if remaining == 0 {
            let g = reg.store.lock().await;
            if let Some(old) = reg.store.get(Kind::Namespace, "", &ns)? {
                let pending = reg.finalize_delete(&g, Kind::Namespace, old)?;
                drop(g);
                reg.sync(pending).await?;
            }
        }
    }
    Ok(())
}

/// The namespaces (active ones) that lack their `default` ServiceAccount. Pure.
pub fn missing_service_accounts(namespaces: &[serde_json::Value], accounts: &[serde_json::Value]) -> Vec<String> {
    namespaces
        .iter()
        .filter(|n| n["metadata"].get("deletionTimestamp").is_none())
        .map(|n| ns_name(n).1)
        .filter(|ns| !accounts.iter().any(|a| ns_name(a) == (ns.clone(), DEFAULT_SERVICE_ACCOUNT.to_string())))
        .collect()
}

/// Creates the `default` ServiceAccount of every active namespace that lacks it.
pub(crate) async fn service_accounts(reg: &Registry) -> Result<(), ApiError> {
    let (namespaces, _) = reg.store.list(Kind::Namespace, None)?;
    let (accounts, _) = reg.store.list(Kind::ServiceAccount, None)?;
    for ns in missing_service_accounts(&namespaces, &accounts) {
        let sa = json!({"metadata": {"name": DEFAULT_SERVICE_ACCOUNT}});
        match reg.create(Kind::ServiceAccount, Some(&ns), sa, &WriteOptions::default()).await {
            // Created meanwhile, or the namespace started terminating: nothing to do.
            Ok(_)
            | Err(ApiError::AlreadyExists { .. })
            | Err(ApiError::Forbidden { .. })
            | Err(ApiError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_active_namespace_gets_a_default_service_account() {
        let namespaces = [
            json!({"metadata": {"name": "default"}}),
            json!({"metadata": {"name": "shop"}}),
            json!({"metadata": {"name": "gone", "deletionTimestamp": "2026-11-24T00:00:00Z"}}),
        ];
        let accounts = [
            json!({"metadata": {"namespace": "default", "name": "default"}}),
            json!({"metadata": {"namespace": "shop", "name": "robot"}}),
        ];
        assert_eq!(missing_service_accounts(&namespaces, &accounts), ["shop"]);
    }
}
