// SPDX-License-Identifier: Apache-2.0

package api

import (
	"errors"
	"strings"
)

// RequirementsMet is the AnnotationRequirements value of a node that meets every
// requirement.
const RequirementsMet = "met"

// RequirementMemoryFence starts the AnnotationRequirements line that says which fence
// below the process holds GPU memory on the node ("memory-fence: driver on GPU-…;
// hook and watchdog on GPU-… (MIG mode)"). It is information for operators, never an
// unmet requirement: a node without the driver's fence still has the hook's and the
// watchdog's.
const RequirementMemoryFence = "memory-fence"

// RequirementsError returns why a node whose AnnotationRequirements value is raw
// must not get GPU pods, or nil. A node without the annotation (an agent that does
// not check, or has not yet) is not refused on that account, nor one whose only
// lines besides "met" are information (RequirementMemoryFence).
func RequirementsError(raw string) error {
	var lines []string
	for _, l := range strings.FieldsFunc(raw, func(r rune) bool { return r == '\n' }) {
		l = strings.TrimSpace(l)
		if l == "" || l == RequirementsMet || strings.HasPrefix(l, RequirementMemoryFence+":") {
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		return nil
	}
	return errors.New("node does not meet Tessera's requirements, and its node agent refuses GPU containers until it does: " +
		strings.Join(lines, "; ") + " (see the node's TesseraRequirementNotMet events)")
}
