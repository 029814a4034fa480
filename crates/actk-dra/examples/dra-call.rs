//! Calls a DRA driver's socket as the kubelet does, for debugging a node by hand:
//!
//! ```text
//! cargo run -p actk-dra --example dra-call -- SOCKET prepare|unprepare NAMESPACE NAME UID
//! ```
//!
//! Prints the response (devices and CDI names, or the claim's error) as JSON.

use actk_dra::api::v1;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [sock, op, namespace, name, uid] = args.as_slice() else {
        eprintln!("usage: dra-call SOCKET prepare|unprepare NAMESPACE NAME UID");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let ch = actk_node::uds::connect(std::path::Path::new(sock)).await?;
        let mut c = v1::dra_plugin_client::DraPluginClient::new(ch);
        let claim = v1::Claim { namespace: namespace.clone(), uid: uid.clone(), name: name.clone() };
        let out = match op.as_str() {
            "prepare" => {
                let r = c.node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim] }).await?;
                let r = r.into_inner();
                let claims: serde_json::Map<String, serde_json::Value> = r
                    .claims
                    .into_iter()
                    .map(|(k, v)| {
                        let devs: Vec<serde_json::Value> = v
                            .devices
                            .iter()
                            .map(|d| serde_json::json!({"requests": d.request_names, "pool": d.pool_name, "device": d.device_name, "cdi": d.cdi_device_ids}))
                            .collect();
                        (k, serde_json::json!({"devices": devs, "error": v.error}))
                    })
                    .collect();
                serde_json::Value::Object(claims)
            }
            "unprepare" => {
                let r = c.node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim] }).await?;
                let claims: serde_json::Map<String, serde_json::Value> =
                    r.into_inner().claims.into_iter().map(|(k, v)| (k, serde_json::json!({"error": v.error}))).collect();
                serde_json::Value::Object(claims)
            }
            other => return Err(format!("unknown operation {other:?}: use prepare or unprepare").into()),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        Ok(())
    })
}
