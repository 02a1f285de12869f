// uPlot's files, embedded at build time (common/report/CMakeLists.txt): the report page
// inlines them, so it needs no network.
#pragma once

namespace zenflow::report {

extern const char* const kUplotJs;       // dist/uPlot.iife.min.js (defines window.uPlot)
extern const char* const kUplotCss;      // dist/uPlot.min.css
extern const char* const kUplotLicense;  // its MIT license, kept with the copy in each page

}  // namespace zenflow::report
