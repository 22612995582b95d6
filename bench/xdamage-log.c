// Logs what a window repaints, from the X server's DAMAGE extension: per second, the
// number of damaged rectangles, their summed area and a histogram of their sizes
// (docs/performance.md, "How fast the window streams"). XDAMAGE_VERBOSE=1 prints every rectangle.
//
//   cc -O2 -o /tmp/xdamage-log bench/xdamage-log.c -lXdamage -lX11
//   /tmp/xdamage-log $(xdotool search --onlyvisible --name '^pocketchat$') 10
#include <X11/Xlib.h>
#include <X11/extensions/Xdamage.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/select.h>
#include <sys/time.h>

static double now(void) {
  struct timeval t;
  gettimeofday(&t, 0);
  return t.tv_sec + t.tv_usec / 1e6;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s WINDOW_ID SECONDS\n", argv[0]);
    return 2;
  }
  Display *display = XOpenDisplay(0);
  if (!display) {
    fprintf(stderr, "cannot open the display\n");
    return 1;
  }
  Window window = strtoul(argv[1], 0, 0);
  double seconds = atof(argv[2]);
  int event_base, error_base;
  if (!XDamageQueryExtension(display, &event_base, &error_base)) {
    fprintf(stderr, "the X server has no DAMAGE extension\n");
    return 1;
  }
  XDamageCreate(display, window, XDamageReportRawRectangles);
  XSync(display, 0);
  int verbose = getenv("XDAMAGE_VERBOSE") != 0;
  double start = now(), second = start, area = 0;
  long count = 0;
  int sizes[7] = {0};  // px: <1k, <10k, <50k, <100k, <300k, <1M, more
  const double bounds[6] = {1e3, 1e4, 5e4, 1e5, 3e5, 1e6};
  while (now() - start < seconds) {
    while (XPending(display)) {
      XEvent event;
      XNextEvent(display, &event);
      if (event.type != event_base + XDamageNotify) continue;
      XDamageNotifyEvent *damage = (XDamageNotifyEvent *)&event;
      double px = (double)damage->area.width * damage->area.height;
      int bucket = 0;
      while (bucket < 6 && px >= bounds[bucket]) bucket++;
      sizes[bucket]++;
      count++;
      area += px;
      if (verbose)
        printf("%.3f %d,%d %dx%d\n", now() - start, damage->area.x, damage->area.y, damage->area.width,
               damage->area.height);
    }
    if (now() - second >= 1.0) {
      printf("t=%.0f s  rects=%ld  area=%.0f kpx  sizes(<1k <10k <50k <100k <300k <1M more)= %d %d %d %d %d %d %d\n",
             now() - start, count, area / 1e3, sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], sizes[5], sizes[6]);
      fflush(stdout);
      count = 0;
      area = 0;
      for (int i = 0; i < 7; i++) sizes[i] = 0;
      second = now();
    }
    struct timeval pause = {0, 2000};
    select(0, 0, 0, 0, &pause);
  }
  return 0;
}
