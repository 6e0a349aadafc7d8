// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"flag"
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // the json format (zap underneath)
	"k8s.io/klog/v2"
)

// AddLoggingFlags registers component-base's logging flags on fs — --logging-format
// (json by default here, or text), -v, --vmodule, --log-flush-frequency and the split
// stream options — the same flags kube-scheduler has, and returns the configuration
// they fill.
func AddLoggingFlags(fs *flag.FlagSet) *logsapi.LoggingConfiguration {
	c := logsapi.NewLoggingConfiguration()
	c.Format = logsapi.JSONLogFormat
	logsapi.AddGoFlags(c, fs)
	return c
}

// loggingGates are the feature gates component-base's logging options read.
func loggingGates() (featuregate.MutableFeatureGate, error) {
	fg := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(fg); err != nil {
		return nil, err
	}
	return fg, nil
}

// ValidateLogging checks a logging configuration without applying it.
func ValidateLogging(c *logsapi.LoggingConfiguration) error {
	fg, err := loggingGates()
	if err != nil {
		return err
	}
	if errs := logsapi.Validate(c, fg, nil); len(errs) > 0 {
		return fmt.Errorf("logging flags: %w", errs.ToAggregate())
	}
	return nil
}

// ApplyLogging validates c and routes all logging through it: the agent's own lines
// (the returned logger) and client-go's (klog) then share one format and one stream.
// flush writes what is buffered; call it before exiting.
func ApplyLogging(c *logsapi.LoggingConfiguration) (log logr.Logger, flush func(), err error) {
	fg, err := loggingGates()
	if err != nil {
		return logr.Discard(), func() {}, err
	}
	if err := logsapi.ValidateAndApply(c, fg); err != nil {
		return logr.Discard(), func() {}, fmt.Errorf("logging flags: %w", err)
	}
	return klog.Background(), klog.Flush, nil
}
