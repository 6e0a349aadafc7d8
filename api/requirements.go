package api

import (
	"errors"
	"strings"
)

// RequirementsMet is the AnnotationRequirements value of a node that meets every
// requirement.
const RequirementsMet = "met"

// RequirementsError returns why a node whose AnnotationRequirements value is raw
// must not get GPU pods, or nil. A node without the annotation (an agent that does
// not check, or has not yet) is not refused on that account.
func RequirementsError(raw string) error {
	raw = strings.TrimSpace(raw)
	if raw == "" || raw == RequirementsMet {
		return nil
	}
	lines := strings.FieldsFunc(raw, func(r rune) bool { return r == '\n' })
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return errors.New("node does not meet Tessera's requirements, and its node agent refuses GPU containers until it does: " +
		strings.Join(lines, "; ") + " (see the node's TesseraRequirementNotMet events)")
}
