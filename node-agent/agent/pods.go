// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// podCache is this node's pods, watched with a field selector on spec.nodeName so the
// agent never lists or watches another node's pods. The container binding checks
// every assignment against its pod through it, and the fallback binding identifies
// callers' pods in it.
type podCache struct {
	client   kubernetes.Interface
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	// timeout bounds one read from the API server.
	timeout time.Duration
}

const byUID = "uid"

func newPodCache(client kubernetes.Interface, node string) (*podCache, error) {
	c := &podCache{client: client, timeout: 5 * time.Second}
	c.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=" + node
	}))
	c.informer = c.factory.Core().V1().Pods().Informer()
	if err := c.informer.AddIndexers(cache.Indexers{byUID: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return []string{string(p.UID)}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	return c, nil
}

// start runs the informer until ctx is done.
func (c *podCache) start(ctx context.Context) { c.factory.Start(ctx.Done()) }

func (c *podCache) shutdown() { c.factory.Shutdown() }

// synced waits until the cache holds the node's pods, or ctx is done.
func (c *podCache) synced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced)
}

// Cached returns the cached pod with this UID (nil when there is none), and false
// while the cache is not synchronised.
func (c *podCache) Cached(uid string) (*corev1.Pod, bool) {
	if !c.informer.HasSynced() {
		return nil, false
	}
	return c.PodByUID(uid), true
}

// PodByUID returns the cached pod with this UID, or nil.
func (c *podCache) PodByUID(uid string) *corev1.Pod {
	objs, err := c.informer.GetIndexer().ByIndex(byUID, uid)
	if err != nil || len(objs) == 0 {
		return nil
	}
	p, _ := objs[0].(*corev1.Pod)
	return p
}

// Get returns the pod with this namespace, name and UID (any UID when uid is empty):
// from the cache unless fresh is set or the cache does not have it, from the API
// server otherwise. (nil, nil) when no such pod exists. Pods are never modified.
func (c *podCache) Get(namespace, name, uid string, fresh bool) (*corev1.Pod, error) {
	match := func(p *corev1.Pod) *corev1.Pod {
		if p == nil || (uid != "" && string(p.UID) != uid) {
			return nil
		}
		return p
	}
	if !fresh {
		if uid != "" {
			if p := c.PodByUID(uid); p != nil && p.Namespace == namespace && p.Name == name {
				return p, nil
			}
		} else if obj, ok, err := c.informer.GetIndexer().GetByKey(namespace + "/" + name); err == nil && ok {
			if p := match(obj.(*corev1.Pod)); p != nil {
				return p, nil
			}
		}
	}
	if namespace == "" || name == "" {
		return nil, fmt.Errorf("pod %s is not in this node's pod cache and has no namespace and name to read it by", uid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	p, err := c.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return match(p), nil
}
