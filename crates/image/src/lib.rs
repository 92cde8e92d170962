//! Image import (in progress).
