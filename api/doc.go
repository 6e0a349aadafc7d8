// SPDX-License-Identifier: Apache-2.0

// Package api is Tessera's wire contract: the names and formats that the scheduler
// plugins, the node agent, the CUDA hook and the documentation all share.
//
//   - Resource names a container asks for (configurable domain, default tessera.dev).
//   - The node inventory annotation the node agent publishes on its Node.
//   - The pod assignment annotation the scheduler writes when it binds the pod (in
//     the binding by default, or in PreBind with assignmentWrite: PreBind).
//   - The per-container limits file the node agent hands to the CUDA hook.
//
// Every annotation is JSON with a "version" field. Decode functions never panic on
// malformed input: they return an error that says what is wrong, and Validate checks
// the invariants every consumer relies on.
//
// This package imports only the Kubernetes API types; anything may import it.
package api
