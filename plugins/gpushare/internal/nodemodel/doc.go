// SPDX-License-Identifier: Apache-2.0

// Package nodemodel is a node's decoded GPU inventory in the form the scheduler
// decides against: its schedulable devices (whole GPUs and MIG instances), their
// health, sharing mode and device kind, the pair affinities between them and their
// NVLink islands (model.go). A Model is built once per published inventory and is
// immutable; what is granted on its devices is kept by package placement.
//
// It imports only api/: neither the scheduler framework nor placement, whose
// allocator, placers and cache read its models.
package nodemodel
