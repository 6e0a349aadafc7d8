package agent

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger returns a zap logger behind logr: JSON lines by default, human-readable
// console output when format is "console". verbosity is logr's V level: 0 logs Info,
// 1 also logs V(1), and so on.
func NewLogger(format string, verbosity int) (logr.Logger, func(), error) {
	var cfg zap.Config
	switch format {
	case "json", "":
		cfg = zap.NewProductionConfig()
		cfg.EncoderConfig.TimeKey = "ts"
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
		// Errors here are operational (a node without a driver, an API error), not bugs:
		// a stack trace would only bury the message.
		cfg.DisableStacktrace = true
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.DisableStacktrace = true
	default:
		return logr.Discard(), func() {}, fmt.Errorf("--log-format: %q is not json or console", format)
	}
	if verbosity < 0 || verbosity > 10 {
		return logr.Discard(), func() {}, fmt.Errorf("-v: %d out of range 0..10", verbosity)
	}
	// zap levels below Debug are how zapr expresses logr's V levels.
	cfg.Level = zap.NewAtomicLevelAt(zapcore.Level(-verbosity))
	cfg.Sampling = nil
	z, err := cfg.Build()
	if err != nil {
		return logr.Discard(), func() {}, err
	}
	return zapr.NewLogger(z), func() { _ = z.Sync() }, nil
}
